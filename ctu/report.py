"""``ctu report RUN_DIR``: training curves from metrics.jsonl and every held-out evaluation to PNG, and the
before/after table ``ctu train`` ends with."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctu.tracking import read_evals, read_metrics

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


def draw_curves(run_dir: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
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
    return "\n".join(lines)
