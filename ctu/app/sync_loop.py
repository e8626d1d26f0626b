"""The trainer's side of synchronous rollouts (``trainer.max_staleness = 0``): one step's groups, played now.

:func:`collect_now` draws ``trainer.tasks_per_step`` tasks, plays ``trainer.samples_per_task`` episodes of each
on the run's pool and scores them (with dynamic sampling: draws again until enough groups are informative);
:mod:`ctu.app.async_loop` answers the same question from the background producer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctu.rl.advantages import informative_groups
from ctu.rl.step_advantages import episode_token_advantages, spec_indices, step_estimator_normalizes
from ctu.rollout.loop import Branching, EpisodeSpec, Trajectory


@dataclass(frozen=True)
class TrainingRewards:
    """Rewards used for advantages: the env's, filtered, plus the optional judge shaping (training only)."""

    env: tuple[float, ...]
    shaped: tuple[float, ...]
    # trainer.advantage=remax: per episode, the reward of the greedy episode of its task (None: that one errored)
    baseline: tuple[float | None, ...] | None = None


def collect_now(trainer) -> tuple[list[Trajectory], list[str], TrainingRewards, set[str], int]:
    """Rollouts for step ``trainer.step``: (trajectories, their group ids, rewards, the groups to train on, extra
    draws).

    With dynamic sampling, groups whose rewards are all equal carry no signal: further groups are drawn
    until ``tasks_per_step`` groups are informative or ``dynamic_sampling_max_draws`` extra draws are
    spent; the first ``tasks_per_step`` informative groups are trained on. Every episode drawn is kept
    for the step's metrics."""
    t = trainer.config.trainer
    trajectories: list[Trajectory] = []
    groups: list[str] = []
    env: list[float] = []
    shaped: list[float] = []
    needed, draws = t.tasks_per_step, 0
    while True:
        # trainer.contrast_pairs: each task and its twin (or, contrast_pairs_all, itself again) are one group
        picks = trainer.sampler.pairs(needed // 2, t.contrast_pairs_all) if t.contrast_pairs else trainer.sampler.sample(needed)
        specs = [EpisodeSpec(d, task, s) for d, task in picks for s in range(t.samples_per_task)]
        seed = trainer.config.run.seed * 1_000_003 + trainer.step * 7919 + draws * 104_729
        branch = {"branch": Branching(t.branch_k, t.branch_at)} if t.branch_k > 1 else {}
        batch = trainer._rollout(specs, trainer.config.sampling.temperature, seed=seed, **branch)
        rewards = trainer.rewards(batch)
        trajectories += batch
        size = t.samples_per_task * (2 if t.contrast_pairs else 1)
        # a spec's siblings (trainer.branch_k) join its task's group
        at = spec_indices([getattr(tr, "fork", None) for tr in batch])
        groups += [f"{tr.domain}/{specs[i - i % size].task.id}/{draws}.{i // size}" for i, tr in zip(at, batch, strict=True)]
        env += rewards.env
        shaped += rewards.shaped
        if not t.dynamic_sampling:
            baseline = greedy_baselines(trainer, picks, seed) if t.advantage == "remax" else None
            return trajectories, groups, TrainingRewards(tuple(env), tuple(shaped), baseline), set(groups), draws
        scored = [i for i, tr in enumerate(trajectories) if tr.stop_reason != "error"]
        informative = {groups[scored[j]] for j in informative_groups([shaped[i] for i in scored],
                                                                      [groups[i] for i in scored])}
        if len(informative) >= t.tasks_per_step or draws >= t.dynamic_sampling_max_draws:
            chosen = set(sorted(informative, key=groups.index)[: t.tasks_per_step])
            return trajectories, groups, TrainingRewards(tuple(env), tuple(shaped)), chosen, draws
        needed, draws = t.tasks_per_step - len(informative), draws + 1


def greedy_baselines(trainer, picks, seed: int) -> tuple[float | None, ...]:
    """ReMax's baseline: a greedy episode of each picked task by the same policy (never trained on); its reward
    is the baseline of every sample of that task (None where it errored)."""
    greedy = trainer._rollout([EpisodeSpec(d, task, 0) for d, task in picks], 0.0, seed=seed)
    rewards = trainer.rewards(greedy).shaped
    per_task = [None if tr.stop_reason == "error" else r for tr, r in zip(greedy, rewards, strict=True)]
    return tuple(b for b in per_task for _ in range(trainer.config.trainer.samples_per_task))


def step_credit(trajectories, advantages: dict[int, float], rewards, groups, t) -> dict[int, list[float]]:
    """Per-token advantages where they differ within an episode (a forked episode's shared prefix, the step term
    ``trainer.step_advantage_weight``); {} where every episode trains with its one advantage, as before."""
    forks = [tr.fork for tr in trajectories]
    if not t.step_advantage_weight and all(f is None for f in forks):
        return {}
    return episode_token_advantages(advantages, rewards, groups, [tr.prompt_ids for tr in trajectories],
                                    [tr.response_ids for tr in trajectories],
                                    [tr.assistant_spans for tr in trajectories], forks,
                                    weight=t.step_advantage_weight,
                                    normalize_std=step_estimator_normalizes(t.advantage))
