"""RL's change in held-out success over several seeds, from the runs' own evaluations (``nox -s outcome`` runs the
quickstart for seeds 0-2 and then this).

For each run directory: success after the warm start and at the end, each with a 95% percentile-bootstrap interval
over the held-out tasks, and the change with a paired bootstrap over the same tasks (eval/<tag>/trajectories.jsonl,
named by eval/history.jsonl). Across the runs: mean, min and max of the change, a Student's t interval over seeds
(3 seeds: t(2) = 4.303, wide on purpose) and a paired bootstrap over all the runs' (seed, task) pairs.

    python -m scripts.outcome runs/outcome/seed_0 runs/outcome/seed_1 runs/outcome/seed_2 [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ctu.observe.report import run_outcome
from ctu.observe.stats import paired_change_ci, seeds_summary


def aggregate(run_dirs: Sequence[str | Path]) -> dict[str, Any]:
    runs, warm_all, final_all = [], {}, {}
    for run_dir in run_dirs:
        out = run_outcome(run_dir)
        if out is None:
            raise SystemExit(f"{run_dir}: no final evaluation with trajectories (eval/history.jsonl and "
                             "eval/<tag>/trajectories.jsonl); did the run finish?")
        runs.append({"run": str(run_dir), "baseline": out["baseline"], "tasks": out["tasks"],
                     **{k: asdict(out[k]) for k in ("warm", "final", "change")}})
        warm_all.update({f"{run_dir}::{k}": v for k, v in out["warm_tasks"].items()})
        final_all.update({f"{run_dir}::{k}": v for k, v in out["final_tasks"].items()})
    changes = [r["change"]["mean"] for r in runs]
    return {"runs": runs, "change_across_seeds": seeds_summary(changes),
            "warm_across_seeds": seeds_summary([r["warm"]["mean"] for r in runs]),
            "final_across_seeds": seeds_summary([r["final"]["mean"] for r in runs]),
            "change_pooled": asdict(paired_change_ci(warm_all, final_all))}


def report(result: dict[str, Any]) -> str:
    def ci(d: dict[str, Any], sign: str = "") -> str:
        return f"{d['mean']:{sign}.3f} [{d['low']:{sign}.3f}, {d['high']:{sign}.3f}]"

    lines = [f"{'run':<32} {'tasks':>5}  {'warm start':<22} {'final':<22} change (paired over tasks)"]
    for r in result["runs"]:
        lines.append(f"{Path(r['run']).name[-32:]:<32} {r['tasks']:>5}  {ci(r['warm']):<22} {ci(r['final']):<22} "
                     f"{ci(r['change'], '+')}")
    s, pooled, n = result["change_across_seeds"], result["change_pooled"], result["change_across_seeds"]["n"]
    spread = (f"95% t interval over seeds [{s['low']:+.3f}, {s['high']:+.3f}]" if n > 1
              else "no interval over seeds from one run")
    lines.append(f"RL change (final - warm start) over {n} seeds: mean {s['mean']:+.3f}, min {s['min']:+.3f}, "
                 f"max {s['max']:+.3f}; {spread}")
    lines.append(f"pooled paired bootstrap over {pooled['n']} (seed, task) pairs: {ci(pooled, '+')}")
    holds = n > 1 and s["low"] > 0 and pooled["low"] > 0
    lines.append("the gain holds at 95% across seeds" if holds else
                 "not established: an interval reaches 0 or below; report the change with its interval, not as a gain")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (run.dir of each seed)")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args(argv)
    result = aggregate(args.runs)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
