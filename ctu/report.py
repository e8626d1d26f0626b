"""``ctu report RUN_DIR``: training curves from metrics.jsonl to PNG."""

from __future__ import annotations

from pathlib import Path

from ctu.tracking import read_metrics

PANELS = (("rollout/reward", "rollout/success"), ("train/loss", "train/pg_loss"), ("train/kl", "train/entropy"),
          ("train/grad_norm", "train/clip_fraction"))


def draw_curves(run_dir: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(f"{Path(run_dir) / 'metrics.jsonl'} has no records to draw")
    eval_keys = sorted({k for r in rows for k in r if k.startswith("eval/")})
    panels = [*PANELS, tuple(eval_keys)] if eval_keys else list(PANELS)
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.6 * len(panels)), sharex=True)
    for ax, keys in zip(axes, panels, strict=True):
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=key)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    out = Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
