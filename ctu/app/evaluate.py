"""Evaluation: k samples per task over domains and splits -> report.json, report.md, trajectories, plot.

Rewards here are the environment's own (``Trajectory.reward``): evaluation never
receives shaped training rewards.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctu.config.atomic import atomic_open, atomic_write_text
from ctu.config.redact import redact, redact_data
from ctu.domains.base import Domain
from ctu.observe.metrics import distribution, mean, pass_curves
from ctu.rollout.loop import EpisodeSpec, Trajectory

# how messages name the phases of a run's evaluations (ctu.observe.tracking.eval_phase); periodic and final as they are
PHASE_WORDS = {"before": "before training", "after_warm_start": "after the warm start"}


class NothingScored(RuntimeError):
    """Every episode of an evaluation or a training step errored: there is nothing to score or to train on."""


def all_errored(trajectories: Sequence[Trajectory]) -> str | None:
    """``all N episode(s) errored (first error: ...)`` when every episode of a non-empty batch errored (no episode
    could be scored), else None: some episodes erroring is counted (``errored``), not a failure."""
    if not trajectories or any(t.stop_reason != "error" for t in trajectories):
        return None
    first = next((t.error for t in trajectories if t.error), None) or "no error recorded"
    return f"all {len(trajectories)} episode(s) errored (first error: {first})"


def episode_specs(domains: Sequence[Domain], splits: Sequence[str], samples: int,
                  max_tasks: int | None = None) -> list[EpisodeSpec]:
    """Every (domain, split) task, ``samples`` times each; tasks in split order, first ``max_tasks``."""
    specs: list[EpisodeSpec] = []
    for domain in domains:
        seen: set[str] = set()
        for split in splits:
            tasks = domain.split(split)
            for task in tasks[: max_tasks if max_tasks is not None else len(tasks)]:
                if task.id in seen:
                    continue
                seen.add(task.id)
                specs.extend(EpisodeSpec(domain, task, s) for s in range(samples))
    return specs


def nothing_to_evaluate(domains: Sequence[Domain], splits: Sequence[str], specs: Sequence[EpisodeSpec]) -> str | None:
    """Why an evaluation of no episode is refused (a success rate over 0 episodes measures nothing), in one line
    naming the splits and what each domain holds; None when there are episodes."""
    if specs:
        return None
    held = "; ".join(f"{d.name}: " + (", ".join(f"{split} {len(d.split(split))} tasks" for split in splits) or "no split")
                     for d in domains)
    return (f"nothing to evaluate: eval.splits=[{', '.join(splits)}] gives 0 episodes ({held}); name splits that "
            "hold tasks, or give tasks (env.tasks)")


@contextmanager
def progress_bar(total: int, desc: str = "eval") -> Iterator:
    """A console bar over ``total`` episodes with the running success rate; yields the per-episode callback
    (``on_done`` of :func:`ctu.rollout.loop.rollout` and of a rollout pool). Hidden when stderr is not a terminal."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="episode", dynamic_ncols=True, disable=None)
    wins = [0, 0]

    def done(trajectory: Trajectory) -> None:
        wins[0] += trajectory.success
        wins[1] += 1
        bar.set_postfix(success=f"{wins[0] / wins[1]:.2f}")
        bar.update()

    try:
        yield done
    finally:
        bar.close()


def play_episodes(config, specs: Sequence[EpisodeSpec], chat, engine, user, judge) -> list[Trajectory]:
    """The evaluation's episodes at ``eval.temperature``, NL assertions judged: played by ``agent.command`` when
    the config names one (the program a user trains is the one evaluated, docs/agents.md), else by ctu's loop on
    ``engine``; a progress bar over them. Closes the engine."""
    from ctu.distributed.agent_pool import AgentPool
    from ctu.distributed.pool import LocalPool
    from ctu.rollout import components as build

    try:
        pool = (AgentPool.from_config(config, engine, chat, user, judge=judge) if config.agent.command
                else LocalPool.from_config(config, engine, chat, user, judge=judge))
    except BaseException:
        engine.close()
        raise
    try:
        with progress_bar(len(specs)) as done:
            return pool.run(specs, build.sampling_params(config, config.eval.temperature), seed=0,
                            judge_enabled=True, on_done=done)
    finally:
        pool.close()


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Metrics per domain and overall. Errored episodes are excluded from rewards but counted.

    Only :class:`Trajectory` objects (environment rewards) are accepted: shaped training rewards
    live in ``ctu.app.trainer.TrainingRewards`` and can never reach an evaluation report.
    """
    for t in trajectories:
        if not isinstance(t, Trajectory):
            raise TypeError(f"evaluation takes Trajectory objects, not {type(t).__name__}")
    by_domain: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_domain[t.domain].append(t)
    report = {name: _summary(trs) for name, trs in sorted(by_domain.items())}
    report["overall"] = _summary(list(trajectories))
    return report


def _summary(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    scored = [t for t in trajectories if t.stop_reason != "error"]
    per_task: dict[str, list[bool]] = defaultdict(list)
    for t in scored:
        per_task[f"{t.domain}/{t.task_id}"].append(t.success)
    curves = pass_curves(per_task)
    turns = [t.turns for t in scored]
    return {
        "episodes": len(trajectories),
        "errored": len(trajectories) - len(scored),
        "tasks": len(per_task),
        "success_rate": mean(float(t.success) for t in scored),
        "mean_reward": mean(t.reward for t in scored),
        "pass^k": {str(k): v for k, v in curves["pass^k"].items()},
        "pass@k": {str(k): v for k, v in curves["pass@k"].items()},
        "parse_failure_rate": (sum(t.parse_failures for t in scored) / max(1, sum(t.turns for t in scored))),
        "mean_turns": mean(turns),
        "stop_reasons": distribution(t.stop_reason for t in trajectories),
        "terminations": distribution(str(t.termination) for t in trajectories),
        "timings_s": {k: sum(t.timings.get(k, 0.0) for t in trajectories) for k in ("model", "env", "user")},
    }


def _markdown(report: dict[str, Any]) -> str:
    lines = ["# Evaluation report", "",
             "| scope | episodes | errored | tasks | success | mean reward | parse failures | mean turns |",
             "|---|---|---|---|---|---|---|---|"]
    for scope, s in report.items():
        lines.append(f"| {scope} | {s['episodes']} | {s['errored']} | {s['tasks']} | {s['success_rate']:.3f} | "
                     f"{s['mean_reward']:.3f} | {s['parse_failure_rate']:.3f} | {s['mean_turns']:.2f} |")
    lines += ["", "## pass^k and pass@k", "", "| scope | k | pass^k | pass@k |", "|---|---|---|---|"]
    for scope, s in report.items():
        for k, v in s["pass^k"].items():
            lines.append(f"| {scope} | {k} | {v:.3f} | {s['pass@k'][k]:.3f} |")
    lines += ["", "## Stop reasons", "", "| scope | stop reasons | timings (s) |", "|---|---|---|"]
    for scope, s in report.items():
        timings = ", ".join(f"{k} {v:.1f}" for k, v in s["timings_s"].items())
        lines.append(f"| {scope} | {json.dumps(s['stop_reasons'])} | {timings} |")
    return "\n".join(lines) + "\n"


def plot_pass_k(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for scope, s in report.items():
        ks = [int(k) for k in s["pass^k"]]
        if ks:
            ax.plot(ks, list(s["pass^k"].values()), marker="o", label=f"{scope} pass^k")
            ax.plot(ks, list(s["pass@k"].values()), marker="x", linestyle="--", label=f"{scope} pass@k")
    ax.set_xlabel("k")
    ax.set_ylabel("rate")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.set_title("pass^k / pass@k")
    fig.tight_layout()
    try:
        with atomic_open(path, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
    finally:
        plt.close(fig)


def write_report(run_dir: str | Path, trajectories: Sequence[Trajectory], save_tokens: bool = False) -> dict[str, Any]:
    """Write report.json, report.md, trajectories.jsonl and pass_k.png into ``run_dir`` (redacted: ``ctu.config.redact``)."""
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = summarize(trajectories)
    atomic_write_text(out / "report.json", json.dumps(redact_data(report), indent=2))  # whole or not at all
    atomic_write_text(out / "report.md", redact(_markdown(report)))
    with atomic_open(out / "trajectories.jsonl") as f:
        for t in trajectories:
            f.write(json.dumps(redact_data(t.to_json(with_tokens=save_tokens)), ensure_ascii=False) + "\n")
    plot_pass_k(report, out / "pass_k.png")
    return report
