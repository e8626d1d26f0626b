"""How the CPU tier slows beside other work: the quickstart's first steps quiet, beside a busy loop at nice 19 and at
nice 0, and beside a stream of small nice-19 processes, with ctu's thread policy on (its default: short OpenMP
spins, threads from the affinity and cgroup quota, generation sharing the CPUs, and the warm start and updates too
where fewer threads give them the same gradients), ``CTU_CPU_THREADS=share`` (they share regardless), ``fixed``
(no sharing) or off (``CTU_CPU_THREADS=off``: libgomp's default spinning).

Each cell runs ``ctu train configs/quickstart.yaml`` cut to ``--sft-steps`` supervised steps, one RL step of
``--tasks`` tasks (its rollouts and its update) and a final evaluation of one task, in a fresh process, and reads
the warm start's seconds from its output and the step's ``rollout_s`` / ``update_s`` from its metrics.jsonl. The
table gives seconds and, in brackets, the ratio to the quiet run of the same policy; a fair share of the CPUs
beside one busy process is ~1.5x on 2 cores (2 threads and 1 busy loop on 2 cores: each gets 2/3 of a core).
The checks whether fewer threads give the same bits run once a run, the first time other programs are busy (in
the first phase that computes beside them): their seconds, from the lines they print, are taken out of that phase
and shown in their own column.

    python benchmarks/contention.py [--conditions quiet nice19 nice0 small] [--policies on off NAME=VALUE]
        [--sft-steps 2] [--tasks 2] [--small 4] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY = [sys.executable, "-c", "while True: pass"]
# a small CLI process: start an interpreter, compute ~0.1 s, exit; a stream of them, like a shell loop of tools
SMALL = "while :; do {py} -c 'sum(i * i for i in range(1500000))'; done"


@contextmanager
def beside(condition: str, small: int):
    """Start the neighbours of ``condition`` (none when quiet), yield, then stop them."""
    procs: list[subprocess.Popen] = []
    if condition in ("nice19", "nice0"):
        procs.append(subprocess.Popen(["nice", "-n", "19" if condition == "nice19" else "0", *BUSY]))
    elif condition == "small":
        procs += [subprocess.Popen(["nice", "-n", "19", "sh", "-c", SMALL.format(py=sys.executable)],
                                   start_new_session=True) for _ in range(small)]
    elif condition != "quiet":
        raise ValueError(f"unknown condition {condition}")
    time.sleep(0.5 if procs else 0)
    try:
        yield
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 15) if condition == "small" else p.terminate()
            except ProcessLookupError:
                pass
            p.wait()


def one_run(policy: str, args, run_dir: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "CTU_CPU_THREADS")}
    if policy == "off":
        env["CTU_CPU_THREADS"] = "off"
    elif "=" in policy:  # a setting of the user's, e.g. OMP_WAIT_POLICY=PASSIVE or GOMP_SPINCOUNT=10000 (kept by ctu)
        name, value = policy.split("=", 1)
        env[name] = value
    cmd = [sys.executable, "-m", "ctu", "train", str(ROOT / "configs/quickstart.yaml"), f"run.dir={run_dir}",
           f"trainer.sft_steps={args.sft_steps}", "trainer.max_steps=1", f"trainer.tasks_per_step={args.tasks}",
           "trainer.eval_before_train=false", "trainer.eval_max_tasks=1", "trainer.ckpt_interval=1000",
           "trainer.examples_interval=1000", *args.overrides]
    started = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    total = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    found = re.search(r"supervised warm start: \d+ steps in ([\d.]+)s", out.stdout)
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    pick = {key.rsplit("/", 1)[-1].rsplit(".", 1)[-1]: v for key, v in record.items() if isinstance(v, (int, float))}
    threads = next((line for line in out.stdout.splitlines() if line.startswith("threads:")), "")
    got = {"warm start": float(found.group(1)) if found else float("nan"), "rollout": pick.get("rollout_s", 0.0),
           "update": pick.get("update_s", 0.0), "checks": 0.0, "total": total}
    warm_done = not found  # before the warm start's line, a check ran inside it (generation's too: its sync probes)
    for line in out.stdout.splitlines():
        warm_done = warm_done or line.startswith("supervised warm start:")
        check = re.match(r"threads: (generation|the updates) .*; checked in ([\d.]+) s\)$", line)
        if check:  # a one-time check, run the first time other programs are busy: out of its phase, reported apart
            seconds = float(check.group(2))
            phase = "warm start" if not warm_done else ("rollout" if check.group(1) == "generation" else "update")
            got[phase] -= seconds
            got["checks"] += seconds
    return {**got, "line": threads}  # type: ignore[dict-item]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conditions", nargs="+", default=["quiet", "nice19", "nice0", "small"])
    ap.add_argument("--policies", nargs="+", default=["on", "off"],
                    help="on (ctu's choice), off (CTU_CPU_THREADS=off: OpenMP's defaults), or NAME=VALUE to set")
    ap.add_argument("--sft-steps", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--small", type=int, default=4, help="small processes at once in the 'small' condition")
    ap.add_argument("--repeats", type=int, default=1, help="runs per cell (the fastest is kept)")
    ap.add_argument("overrides", nargs="*", help="more key=value overrides for ctu train")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs, affinity {len(os.sched_getaffinity(0))}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at start")
    results: dict[tuple[str, str], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for condition in args.conditions:
            for policy in args.policies:
                best: dict[str, float] | None = None
                for _ in range(args.repeats):
                    with beside(condition, args.small):
                        got = one_run(policy, args, Path(tempfile.mkdtemp(dir=tmp, prefix=f"{condition}-")))
                    best = got if best is None or got["total"] < best["total"] else best
                results[(condition, policy)] = best  # type: ignore[assignment]
                print(f"  {condition:<7} policy {policy:<3}: " + ", ".join(
                    f"{k} {v:.1f}s" for k, v in best.items() if k != "line"), flush=True)  # type: ignore[union-attr]
    for policy in args.policies:
        line = results.get((args.conditions[0], policy), {}).get("line")
        print(f"\npolicy {policy}: {line or '(no threads line: CTU_CPU_THREADS=off)'}")
    parts = ("warm start", "rollout", "update", "checks")
    width = max(7, *(len(p) for p in args.policies))
    print(f"\n{'beside':<8} {'policy':<{width}}" + "".join(f"{p:>18}" for p in parts))
    for condition in args.conditions:
        for policy in args.policies:
            got, quiet = results[(condition, policy)], results.get(("quiet", policy))
            cells = []
            for p in parts:
                ratio = f" ({got[p] / quiet[p]:.2f}x)" if quiet and quiet[p] > 0 else ""
                cells.append(f"{got[p]:>9.1f}s{ratio:>8}")
            print(f"{condition:<8} {policy:<{width}}" + "".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    main()
