"""One RL lever at a time, from a cached warm start: N ``train_step``s of ``ctu train`` with config overrides,
then held-out success (greedy, every test task) per mini task kind, so a change shows *what* RL learned or lost.

    python benchmarks/rl_levers.py --cache runs/levers/sft25_s0.pt --steps 8 --evals 4 8 --out runs/levers/t13 \
        [--config configs/quickstart.yaml] [key=value ...]

The warm start (``trainer.sft_steps`` supervised steps) runs once and is kept in ``--cache`` (weights + its
evaluation); later runs with the same cache start from the same weights. Examples of levers:
``sampling.temperature=1.3``, ``trainer.lr=3e-4``, ``env.task_weights={refusal: 2}``, ``trainer.sft_steps=12``
(with another cache file). Results of the levers measured so far: README, "Quickstart: measured".
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_curve import refusals_drawn, replay_step, snapshot, success, task_kind  # noqa: E402

from ctu.app.trainer import Trainer  # noqa: E402
from ctu.config.schema import load_config  # noqa: E402


def per_kind(tasks: dict[str, float], kinds: dict[str, str]) -> str:
    counts: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for key, rate in tasks.items():
        kind = kinds[key]
        counts[kind][0] += rate
        counts[kind][1] += 1
    return " ".join(f"{k}={s:g}/{n}" for k, (s, n) in sorted(counts.items()))


class PhasePeaks:
    """Peak RSS of each phase of a step (``--phase-rss``): the kernel's high-water mark (``VmHWM``, Linux) is reset
    when a wrapped phase begins and read when it ends; ``overall`` keeps the run's maximum, which the reset takes
    from ``ru_maxrss`` (so the trainer's own ``peak_rss_gib`` no longer holds while this is on)."""

    def __init__(self):
        self.peaks: dict[str, float] = {}
        self.overall = 0.0

    @staticmethod
    def high_water_gib() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
        raise RuntimeError("no VmHWM in /proc/self/status")

    def wrap(self, owner, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def measured(*args, **kwargs):
            self.overall = max(self.overall, self.high_water_gib())
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            try:
                return inner(*args, **kwargs)
            finally:
                peak = self.high_water_gib()
                self.peaks[label] = max(self.peaks.get(label, 0.0), peak)
                self.overall = max(self.overall, peak)

        setattr(owner, name, measured)

    def line(self) -> str:
        text = ", ".join(f"{k} {v:.2f}" for k, v in self.peaks.items())
        self.peaks.clear()
        return f"peak RSS by phase (GiB): {text}; run {self.overall:.2f}"


def save_cache(trainer: Trainer, cache: Path, about: dict) -> None:
    """The policy's weights (and its KL reference) at ``cache``, ``about`` beside it as JSON: what
    :func:`from_cache` reads."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": snapshot(trainer), "rebased": trainer.policy.reference_state()}, cache)
    cache.with_suffix(".json").write_text(json.dumps(about))


def from_cache(trainer: Trainer, cache: Path) -> dict:
    """The warm start's weights from ``cache`` (made there first if missing) and its evaluation; the engine synced."""
    if cache.exists():
        state = torch.load(cache, weights_only=True)
        trainer.policy.model.load_state_dict(state["model"])
        trainer.policy.load_reference_state(state["rebased"])
        start = json.loads(cache.with_suffix(".json").read_text())
        del state  # the model holds the weights now
        trainer.sync.base_changed = True
        trainer.sync_weights()  # a warm start syncs the engine itself (weight versions never repeat)
    else:
        began = time.perf_counter()
        trainer.warm_start()  # trainer.sft_data or the gold demos (less trainer.sft_exclude), as ctu train
        start = {"warm_start_s": time.perf_counter() - began, **success(trainer, "warm_start")}
        save_cache(trainer, cache, start)
    return start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--cache", required=True, help="the warm start's weights (.pt) and evaluation (.json)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--evals", type=int, nargs="*", default=[], help="steps after which to evaluate (and the last)")
    ap.add_argument("--out", required=True, help="run directory (evaluations land in OUT/eval)")
    ap.add_argument("--reeval", action="store_true",
                    help="evaluate the cached warm start again under the overrides (e.g. eval.concurrency=1), then stop")
    ap.add_argument("--replay-only", action="store_true",
                    help="the control of trainer.sft_replay: each step updates on its replayed demonstrations alone "
                         "(no rollout, no RL term), with the same optimizer, schedule and draws")
    ap.add_argument("--no-final-eval", action="store_true", help="evaluate only after the --evals steps")
    ap.add_argument("--logit-budget", type=int, help="fp32 logit elements per lm_head chunk in the trainer's passes "
                    "(ctu.train.logprobs.LOGIT_BUDGET)")
    ap.add_argument("--save", help="keep the trained weights here (.pt, with a .json beside it), as a cache the other "
                    "benchmarks read (e.g. benchmarks/decision_point.py --cache)")
    ap.add_argument("--phase-rss", action="store_true",
                    help="print each step's peak RSS by phase (rollout, update) as well (Linux)")
    ap.add_argument("--bf16-matmuls-in-fp32", action="store_true",
                    help="bf16 numerics on a CPU without native bf16: CTU_NATIVE_BF16=1 (trainer.autocast=auto picks "
                         "bf16) and the trainer's bf16 matmuls computed in fp32 and rounded (benchmarks/bf16_matmuls.py)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.bf16_matmuls_in_fp32:
        import os

        from bf16_matmuls import BF16MatmulsInFP32

        os.environ["CTU_NATIVE_BF16"] = "1"
        with BF16MatmulsInFP32():
            run(args)
    else:
        run(args)


def run(args: argparse.Namespace) -> None:
    if args.logit_budget:
        import ctu.train.logprobs

        ctu.train.logprobs.LOGIT_BUDGET = args.logit_budget
    config = load_config(args.config, [f"run.dir={args.out}", "run.overwrite=true", "trainer.eval_before_train=false",
                                       *args.overrides])
    trainer = Trainer(config)
    kinds = {f"{d.name}/{t.id}": task_kind(t) for d in trainer.domains for t in d.tasks}
    start = from_cache(trainer, Path(args.cache))
    phases = PhasePeaks() if args.phase_rss else None
    if phases:
        phases.wrap(trainer, "_rollout", "rollout")
        phases.wrap(trainer.group, "update", "update")
    print(f"warm start: {start['success']:.3f} {per_kind(start['tasks'], kinds)}", flush=True)
    if args.reeval:  # the same weights, evaluated again: what the evaluation's own settings change
        again = success(trainer, "warm_start_again")
        flipped = sorted(k for k, v in again["tasks"].items() if v != start["tasks"].get(k))
        print(f"evaluated again: {again['success']:.3f} {per_kind(again['tasks'], kinds)}; "
              f"tasks that differ: {', '.join(flipped) or 'none'}", flush=True)
        return
    clock = 0.0
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        if args.replay_only:
            replayed, loss = replay_step(trainer)
            clock += time.perf_counter() - began
            print(f"step {step}: {clock:.0f}s, {replayed} demonstrations replayed alone, loss {loss:.3f}", flush=True)
        else:
            trainer.step += 1
            out = trainer.train_step()
            metrics = out["metrics"]
            refusals, drawn = refusals_drawn(out["trajectories"], kinds) or (0, 0)  # kinds: every task has one
            forked = sum(1 for tr in out["trajectories"] if tr.fork is not None and tr.fork[0] == 0)
            clock += time.perf_counter() - began
            r, tm = metrics["rollout"], metrics["timing"]
            greedy = f", greedy {r['greedy_reward']:.3f}" if "greedy_reward" in r else ""
            print(f"step {step}: {clock:.0f}s, reward {r['reward']:.3f} ({r['episodes']} episodes{greedy}, "
                  f"{r['trained_episodes']} trained, {r['replayed_demos']} demonstrations replayed), refusals drawn "
                  f"{refusals} in {drawn} episodes of refused requests ({forked} forks), rollout "
                  f"{tm['rollout_s']:.0f}s, update {tm['update_s']:.0f}s, entropy {metrics['train']['entropy']:.3f}, "
                  f"peak RSS {tm['peak_rss_gib']:.2f} GiB",
                  flush=True)
        if phases:
            print(f"step {step}: {phases.line()}", flush=True)
        if step in args.evals or (step == args.steps and not args.no_final_eval):
            e = success(trainer, f"step_{step}")
            print(f"after {step} steps: {e['success']:.3f} (95% CI {e['ci']}), change {e['success'] - start['success']:+.3f}; "
                  f"{per_kind(e['tasks'], kinds)}", flush=True)
    if args.save:
        save_cache(trainer, Path(args.save), {"from": args.cache, "steps": args.steps, "overrides": args.overrides})
        print(f"weights after {args.steps} steps: {args.save}", flush=True)


if __name__ == "__main__":
    main()
