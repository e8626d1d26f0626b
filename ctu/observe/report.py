"""``ctu report RUN_DIR``: training curves from metrics.jsonl and every held-out evaluation to PNG, and the
before/after table ``ctu train`` ends with, with 95% bootstrap intervals over the held-out tasks."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctu.observe.records import number
from ctu.observe.stats import bootstrap_ci, paired_change_ci
from ctu.observe.tracking import read_evals, read_metrics

PANELS = (("rollout/reward", "rollout/success"), ("train/loss", "train/pg_loss"), ("train/kl", "train/entropy"),
          ("train/grad_norm", "train/clip_fraction"))
PHASE_NAMES = {"before": "before training", "after_warm_start": "after warm start", "periodic": "periodic",
               "final": "final"}
MARKERS = {"before": "X", "after_warm_start": "s", "periodic": "o", "final": "D"}


def _scopes(evals: Sequence[dict[str, Any]]) -> list[str]:
    scopes = list(dict.fromkeys(k for e in evals for k in e["success"]))
    return ["overall"] if scopes == ["overall"] or len(scopes) <= 2 and "overall" in scopes else scopes


def eval_points(evals: Sequence[dict[str, Any]], scope: str = "overall") -> list[dict[str, Any]]:
    """One point per evaluation: phase, step, minutes since the run's first evaluation began, success."""
    if not evals:
        return []
    start = min(e["started"] for e in evals)
    return [{"phase": e["phase"], "step": e["step"], "minutes": (e["started"] - start) / 60,
             "success": e["success"].get(scope)} for e in evals if e["success"].get(scope) is not None]


def _draw_evals(ax_step, ax_wall, evals: Sequence[dict[str, Any]]) -> None:
    for scope in _scopes(evals):
        points = eval_points(evals, scope)
        for ax, x in ((ax_step, "step"), (ax_wall, "minutes")):
            line = ax.plot([p[x] for p in points], [p["success"] for p in points], alpha=0.5,
                           label=f"held-out success ({scope})")[0]
            for phase, marker in MARKERS.items():
                chosen = [p for p in points if p["phase"] == phase]
                if chosen:
                    ax.scatter([p[x] for p in chosen], [p["success"] for p in chosen], marker=marker, s=36,
                               color=line.get_color(), label=f"{PHASE_NAMES[phase]} ({scope})", zorder=3)
    for ax, label in ((ax_step, "step (warm start at step 0)"), (ax_wall, "minutes since the first evaluation")):
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("held-out success")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)


def _metric_problem(record: dict[str, Any]) -> str | None:
    """A drawn metric that is not a number (NaN and infinities are: the curve shows the gap)."""
    for key in (k for keys in PANELS for k in keys):
        if record.get(key) is not None and not number(record[key]):
            return f"'{key}' is not a number"
    return None


def draw_curves(run_dir: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir, _metric_problem)
    evals = read_evals(run_dir)
    if not rows and not evals:
        raise FileNotFoundError(f"{Path(run_dir) / 'metrics.jsonl'} has no records to draw")
    panels = list(PANELS) if rows else []
    n = len(panels) + (2 if evals else 0)
    fig = plt.figure(figsize=(7, 2.6 * n))
    axes: list = []
    for i in range(len(panels)):
        axes.append(fig.add_subplot(n, 1, i + 1, sharex=axes[0] if axes else None))
    for ax, keys in zip(axes, panels, strict=True):
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=key)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if axes:
        axes[-1].set_xlabel("step")
    if evals:
        _draw_evals(fig.add_subplot(n, 1, n - 1), fig.add_subplot(n, 1, n), evals)
    fig.tight_layout()
    out = Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def before_after_table(run_dir: str | Path) -> str:
    """Held-out success of the base model, after the warm start and at the end, as a short console table
    (periodic evaluations are counted, and drawn in curves.png)."""
    evals = read_evals(run_dir)
    if not evals:
        return "no held-out evaluation recorded"
    scopes = _scopes(evals)
    shown = [e for e in evals if e["phase"] != "periodic"]
    head = f"{'held-out success':<18} {'step':>5} {'min':>6} " + " ".join(f"{s:>9}" for s in scopes)
    lines = [head, "-" * len(head)]
    start = min(e["started"] for e in evals)
    for e in shown:
        values = " ".join(f"{e['success'].get(s, float('nan')):>9.3f}" for s in scopes)
        lines.append(f"{PHASE_NAMES[e['phase']]:<18} {e['step']:>5} {(e['started'] - start) / 60:>6.1f} {values}")
    by_phase = {e["phase"]: e["success"].get(scopes[0]) for e in evals}
    chain = [(PHASE_NAMES[p], by_phase[p]) for p in ("before", "after_warm_start", "final")
             if by_phase.get(p) is not None]
    if len(chain) > 1:
        lines.append(f"{scopes[0]}: " + " -> ".join(f"{v:.3f} ({name})" for name, v in chain))
    periodic = sum(e["phase"] == "periodic" for e in evals)
    if periodic:
        lines.append(f"{periodic} periodic evaluation(s) in curves.png and eval/history.jsonl")
    return "\n".join(lines + interval_lines(run_dir, shown))


def task_successes(eval_dir: str | Path) -> dict[str, float] | None:
    """Success rate per held-out task (``domain/task_id``, the mean over its samples, errored episodes left out as in
    report.json) from an evaluation's trajectories.jsonl; None when it has none."""
    path = Path(eval_dir) / "trajectories.jsonl"
    if not path.exists():
        return None
    per_task: dict[str, list[bool]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if row["stop_reason"] != "error":
                per_task[f"{row['domain']}/{row['task_id']}"].append(row["reward"] >= 1.0)
    return {task: sum(oks) / len(oks) for task, oks in sorted(per_task.items())}


def _last(evals: Sequence[dict[str, Any]], phase: str) -> dict[str, Any] | None:
    chosen = [e for e in evals if e["phase"] == phase]
    return chosen[-1] if chosen else None


def run_outcome(run_dir: str | Path) -> dict[str, Any] | None:
    """A run's held-out success after the warm start (the base model's without one) and at the end, each with its
    bootstrap interval over tasks, and the paired interval of the change over the tasks both evaluations scored;
    None when either evaluation or its trajectories are missing."""
    evals = read_evals(run_dir)
    baseline = "after_warm_start" if _last(evals, "after_warm_start") else "before"
    first, last = _last(evals, baseline), _last(evals, "final")
    if first is None or last is None:
        return None
    warm, final = (task_successes(Path(run_dir) / "eval" / e["tag"]) for e in (first, last))
    if not warm or not final:
        return None
    shared = sorted(set(warm) & set(final))
    warm, final = {k: warm[k] for k in shared}, {k: final[k] for k in shared}
    return {"baseline": baseline, "tasks": len(shared), "warm": bootstrap_ci(list(warm.values())),
            "final": bootstrap_ci(list(final.values())), "change": paired_change_ci(warm, final),
            "warm_tasks": warm, "final_tasks": final}


def interval_lines(run_dir: str | Path, shown: Sequence[dict[str, Any]]) -> list[str]:
    """95% percentile-bootstrap intervals over tasks for the shown evaluations and the paired change."""
    rows = []
    for e in shown:
        per_task = task_successes(Path(run_dir) / "eval" / e["tag"])
        if per_task:
            rows.append(f"  {PHASE_NAMES[e['phase']]:<18} {bootstrap_ci(list(per_task.values()))} "
                        f"({len(per_task)} tasks)")
    if not rows:
        return []
    lines = ["95% intervals, percentile bootstrap over held-out tasks (overall):", *rows]
    out = run_outcome(run_dir)
    if out is not None:
        start = PHASE_NAMES[out["baseline"]]
        verdict = ("contains 0: no evidence of a change at 95%" if out["change"].low <= 0.0 <= out["change"].high
                   else "excludes 0")
        lines.append(f"change {start} -> final: {out['change'].signed()} (paired over the same {out['tasks']} tasks; "
                     f"{verdict})")
    return lines
