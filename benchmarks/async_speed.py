"""Synchronous vs asynchronous RL (``trainer.max_staleness`` 0, 1, 2) on the quickstart: steps per hour, where
each step's time goes (trainer and engine idle fractions), staleness and drops, and held-out success after the
steps — with a user simulator whose replies take 1-2 s (an OpenAI-compatible server with a remote model's latency,
``benchmarks/slow_user_server.py``) or with the scripted user.

    python benchmarks/async_speed.py --cache runs/levers/ws10_s0_fp32.pt --steps 3 --staleness 0 1 2 \
        --inflight finish continue --user slow --out runs/async_speed

Every mode starts from the same cached warm start (``benchmarks/rl_levers.py --cache`` writes it; absent, it is
made here) and runs ``ctu train``'s own ``train_step``; k > 0 adds ``trainer.tis_cap`` (the behaviour-policy
correction it needs). The figures and how they were measured: docs/async.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the ctu of this checkout, not an installed one
from learning_curve import snapshot, success  # noqa: E402
from slow_user_server import serve  # noqa: E402

from ctu.app.trainer import Trainer  # noqa: E402
from ctu.config.schema import load_config  # noqa: E402
from ctu.domains import get_domain  # noqa: E402


def idle_fractions(m: dict) -> tuple[float, float]:
    """(trainer idle, engine idle) as fractions of the step's wall time. Synchronous: the trainer waits through the
    rollout and the engine through the update and sync; asynchronous: what the producer and trainer measured."""
    tm = m["timing"]
    if "async" in m:
        return m["async"]["trainer_idle_fraction"], m["async"]["engine_idle_fraction"]
    step = max(1e-9, tm["step_s"])
    return tm["rollout_s"] / step, tm["update_s"] / step  # update_s ends after the sync: it holds sync_s


def run_mode(args, k: int, inflight: str, user: list[str]) -> dict:
    out = Path(args.out) / f"k{k}_{inflight}_{args.user}"
    extra = [f"trainer.max_staleness={k}", f"trainer.inflight={inflight}",
             *([f"trainer.tis_cap={args.tis_cap}"] if k else [])]
    config = load_config(args.config, [f"run.dir={out}", "run.overwrite=true", "trainer.eval_before_train=false",
                                       *user, *extra, *args.overrides])
    trainer = Trainer(config)
    try:
        cache = Path(args.cache)
        if cache.exists():
            state = torch.load(cache, weights_only=True)
            trainer.policy.model.load_state_dict(state["model"])
            trainer.policy.load_reference_state(state["rebased"])
            del state
            trainer.sync.base_changed = True
            trainer.sync_weights()  # version 0: the warm start's weights
        else:
            trainer.warm_start()  # synced as version 0
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": snapshot(trainer), "rebased": trainer.policy.reference_state()}, cache)
        steps = []
        began = time.perf_counter()
        for _ in range(args.steps):
            trainer.step += 1
            m = trainer.train_step()["metrics"]
            t_idle, e_idle = idle_fractions(m)
            row = {"step": trainer.step, "step_s": m["timing"]["step_s"], "rollout_s": m["timing"]["rollout_s"],
                   "update_s": m["timing"]["update_s"], "sync_s": m["timing"]["sync_s"],
                   "reward": m["rollout"]["reward"], "trainer_idle": t_idle, "engine_idle": e_idle,
                   "staleness_mean": m.get("async", {}).get("staleness_mean", 0.0),
                   "dropped_groups": m.get("async", {}).get("dropped_groups", 0),
                   "cancelled_groups": m.get("async", {}).get("cancelled_groups", 0),
                   "update_tokens": m.get("async", {}).get("update_tokens", 0),
                   "interrupted_rows": m.get("async", {}).get("interrupted_rows", 0)}
            steps.append(row)
            print(f"k={k} {inflight} {args.user} step {trainer.step}: {row['step_s']:.0f}s (rollout/wait "
                  f"{row['rollout_s']:.0f}s, update {row['update_s']:.0f}s), reward {row['reward']:.3f}, trainer idle "
                  f"{t_idle:.2f}, engine idle {e_idle:.2f}, staleness {row['staleness_mean']:.2f}, dropped "
                  f"{row['dropped_groups']}, cancelled {row['cancelled_groups']}, tokens during the update "
                  f"{row['update_tokens']}, rows cut {row['interrupted_rows']}", flush=True)
        train_s = time.perf_counter() - began
        held_out = success(trainer, f"step_{trainer.step}") if args.eval else None
    finally:
        trainer.pool.close()
        trainer.group.close()
        trainer.lock.release()
    result = {"k": k, "inflight": inflight, "user": args.user, "steps": steps, "train_s": train_s,
              "steps_per_hour": 3600 * len(steps) / train_s,
              "trainer_idle": sum(s["trainer_idle"] * s["step_s"] for s in steps) / train_s,
              "engine_idle": sum(s["engine_idle"] * s["step_s"] for s in steps) / train_s,
              "phase_s": {key: sum(s[key] for s in steps) / len(steps) for key in ("rollout_s", "update_s", "sync_s")},
              "held_out": None if held_out is None else {"success": held_out["success"], "ci": held_out["ci"]}}
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}), flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--cache", required=True, help="the warm start's weights (.pt), as benchmarks/rl_levers.py keeps")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--user", choices=["slow", "scripted"], default="slow")
    ap.add_argument("--latency", type=float, nargs=2, default=(1.0, 2.0))
    ap.add_argument("--tis-cap", type=float, default=2.0)
    ap.add_argument("--inflight", nargs="+", default=["finish"], choices=["finish", "abort", "continue"],
                    help="trainer.inflight at k > 0 (partial rollouts: abort or continue); k = 0 runs finish")
    ap.add_argument("--no-eval", dest="eval", action="store_false", help="skip the held-out evaluation")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    user: list[str] = []
    server = None
    if args.user == "slow":
        server, url, _ = serve([get_domain("mini")], latency=tuple(args.latency))
        user = ["user.kind=llm", f"user.base_url={url}", "user.model=slow-user"]
    try:
        modes = [(k, m) for k in args.staleness for m in (["finish"] if k == 0 else args.inflight)]
        results = [run_mode(args, k, m, user) for k, m in modes]
    finally:
        if server is not None:
            server.shutdown()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"results_{args.user}.json").write_text(json.dumps(results, indent=1))
    base = results[0]["steps_per_hour"]
    print("\n| k | inflight | user | steps/hour | speed-up | rollout (wait) s | update s | trainer idle | engine idle "
          "| held-out |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        h = r["held_out"]
        held = "-" if h is None else f"{h['success']:.3f} {h['ci']}"
        print(f"| {r['k']} | {r['inflight']} | {r['user']} | {r['steps_per_hour']:.1f} | {r['steps_per_hour'] / base:.2f}x | "
              f"{r['phase_s']['rollout_s']:.0f} | {r['phase_s']['update_s']:.0f} | {r['trainer_idle']:.2f} | "
              f"{r['engine_idle']:.2f} | {held} |")


if __name__ == "__main__":
    main()
