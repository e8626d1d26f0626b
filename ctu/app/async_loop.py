"""The trainer's side of asynchronous RL (``trainer.max_staleness = k > 0``, docs/async.md).

:class:`AsyncRollouts` wires a :class:`~ctu.distributed.async_rollout.RolloutProducer` to the trainer and collects
one step's groups from it: groups are taken in the order they finish; a group whose oldest sampled token is more
than k versions older than the weights the step updates is dropped and counted (:func:`ctu.rl.staleness.is_fresh`);
the step trains on ``trainer.tasks_per_step`` fresh groups (with dynamic sampling: informative ones, taking at most
``tasks_per_step x (1 + dynamic_sampling_max_draws)`` fresh groups, as the synchronous loop draws at most that many).
Each step's ``async/*`` metrics say how stale its tokens were, what was dropped or cancelled, how many tokens were
sampled while the step's update ran and how long trainer and engine waited.
"""

from __future__ import annotations

import time

from ctu.app.sync_loop import TrainingRewards
from ctu.distributed.async_pool import AsyncPool
from ctu.distributed.async_rollout import RolloutProducer, group_seed
from ctu.observe.metrics import mean
from ctu.rl.advantages import informative_groups
from ctu.rl.staleness import is_fresh, min_version, token_staleness
from ctu.rollout import components as build


class AsyncRollouts:
    """One run's producer and the bookkeeping of its steps."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.producer: RolloutProducer | None = None
        self.stats: dict[str, float] = {}
        self._engine_mark = 0.0
        self._cut_mark = 0

    @classmethod
    def of(cls, trainer) -> AsyncRollouts | None:
        """For ``trainer.max_staleness > 0`` (else None), once the trainer's pool and sync exist."""
        if not trainer.config.trainer.max_staleness:
            return None
        return cls(trainer)

    def _producer(self) -> RolloutProducer:
        """Built at the first step, after the warm start or a resume synced the engines; where neither did, the
        weights they hold are sent now as the version the step trains (each version names one set of weights: a
        warm start's are not stamped like the base's). Episodes in this process are played by the producer on the
        pool's engine; elsewhere (rollout workers, an agent program) the pool plays each group (:meth:`AsyncPool.play`)."""
        if self.producer is None:
            tr = self.trainer
            cfg, t = tr.config, tr.config.trainer
            pool: AsyncPool = tr.pool
            here = pool.inner.episodes_in_process
            first_step = tr.step
            if tr.sync.version < first_step - 1:  # nothing synced yet: the initial weights, version step - 1
                tr.sync.after_update(first_step - 1)
            self.producer = RolloutProducer(
                pool.engine if here else None, getattr(pool.inner, "chat", None), getattr(pool.inner, "user", None),
                getattr(pool.inner, "limits", None), build.sampling_params(cfg, cfg.sampling.temperature),
                draw=lambda: tr.sampler.sample(1)[0], samples_per_task=t.samples_per_task,
                max_staleness=t.max_staleness, tasks_per_step=t.tasks_per_step, step=first_step,
                seed=lambda index: group_seed(cfg.run.seed, first_step, index),
                concurrency=getattr(pool.inner, "concurrency", 64),
                max_batch_size=getattr(pool.inner, "max_batch_size", cfg.engine.max_batch_size),
                player=None if here else pool.play)
            pool.producer = self.producer
        return self.producer

    def collect(self):
        """The synchronous ``Trainer.collect``'s answer for step ``trainer.step``: (trajectories, their group ids,
        rewards, the groups to train on, extra groups taken by dynamic sampling)."""
        tr = self.trainer
        t, step = tr.config.trainer, tr.step
        producer = self._producer()
        producer.at_step(step)
        cancelled = producer.cancelled
        trajectories, groups, env, shaped, chosen = [], [], [], [], []
        dropped = dropped_episodes = taken = 0
        waited = 0.0
        budget = t.tasks_per_step * (1 + (t.dynamic_sampling_max_draws if t.dynamic_sampling else 0))
        while len(chosen) < t.tasks_per_step and taken < budget:
            started = time.perf_counter()
            group = producer.take()
            waited += time.perf_counter() - started
            if min_version(group.trajectories) == -1:  # never fresh: every group would be dropped, for ever
                producer.stop()
                raise RuntimeError(f"asynchronous rollouts: the {type(tr.pool.inner).__name__}'s engine returned "
                                   "tokens without the policy version that sampled them, so their staleness is "
                                   "unknown; use an engine that stamps versions or trainer.max_staleness=0")
            if not is_fresh(group.trajectories, step, t.max_staleness):
                dropped, dropped_episodes = dropped + 1, dropped_episodes + len(group.trajectories)
                producer.give_up()
                continue
            taken += 1
            batch = group.trajectories
            rewards = tr.rewards(batch)
            first = batch[0]
            gid = f"{first.domain}/{first.task_id}/a{group.index}"
            trajectories += batch
            groups += [gid] * len(batch)
            env += rewards.env
            shaped += rewards.shaped
            scored = [i for i, e in enumerate(batch) if e.stop_reason != "error"]
            if not t.dynamic_sampling or informative_groups([rewards.shaped[i] for i in scored], [gid] * len(scored)):
                chosen.append(gid)
        producer.give_up(taken - len(chosen))  # taken by dynamic sampling, not trained on: others may start
        if step >= t.max_steps:  # nothing more will be trained on: the episodes in flight are cancelled
            producer.stop()
        kept = set(chosen)
        trained = [e for e, g in zip(trajectories, groups, strict=True) if g in kept]
        staleness = token_staleness(trained, step)
        self.stats = {"dropped_groups": dropped, "dropped_episodes": dropped_episodes,
                      "cancelled_groups": producer.cancelled - cancelled,
                      "staleness_mean": mean(staleness), "staleness_max": max(staleness, default=0),
                      "trainer_wait_s": waited, "groups_in_flight": producer.running,
                      "groups_queued": producer.done.qsize()}
        extra = taken - len(chosen) if t.dynamic_sampling else 0
        return trajectories, groups, TrainingRewards(tuple(env), tuple(shaped)), set(chosen), extra

    def step_metrics(self, step_s: float, update: tuple[float, float] | None = None) -> dict[str, float]:
        """This step's ``async/*`` metrics, ``step_s`` its wall time, ``update`` its update's (start, end) in
        ``time.perf_counter``: staleness and drops, tokens sampled while the update ran (``update_tokens``: the
        overlap asynchronous RL is for; of work that came back by the step's end), the seconds in which generation
        was in flight during it (``update_generating_s``, work still out included), and how long trainer and engine
        waited (engine idle: the step's wall time outside engine calls; trainer idle: waiting for groups)."""
        busy = self.producer.engine_seconds() if self.producer is not None else 0.0
        if update is not None and self.producer is not None:
            self.stats["update_tokens"] = self.producer.sampled_between(*update)
            self.stats["update_generating_s"] = self.producer.generating_during(*update)
        engine_busy, self._engine_mark = busy - self._engine_mark, busy
        cut = getattr(getattr(self.trainer.pool, "engine", None), "interrupted_rows", None)  # trainer.inflight
        if isinstance(cut, int):
            self.stats["interrupted_rows"], self._cut_mark = cut - self._cut_mark, cut
        wait = self.stats.get("trainer_wait_s", 0.0)
        return {**self.stats, "engine_busy_s": engine_busy, "engine_idle_s": max(0.0, step_s - engine_busy),
                "trainer_busy_s": max(0.0, step_s - wait),
                "trainer_idle_fraction": wait / step_s if step_s > 0 else 0.0,
                "engine_idle_fraction": max(0.0, 1.0 - engine_busy / step_s) if step_s > 0 else 0.0}

