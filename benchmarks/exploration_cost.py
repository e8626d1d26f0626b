"""What exploration costs, per task kind: greedy episodes against sampled ones of the same tasks, from a cached
warm start, and why the sampled ones fail: the wrong decision (which write, or none) or the right decision with
a wrong detail (an argument, the closing message).

RL's sequence-level reward blames every token of a failed episode, the decision included. A kind whose successful
episodes need many exact tokens (a change of address copies the new address into the call) fails more often
when sampled than when greedy, so its sampled failures push its *decision* down though the decision was right.

    python benchmarks/exploration_cost.py --cache runs/levers/ws10_s0_fp32.pt --tasks 64 --out runs/explore/s0 \
        [sampling.top_p=0.8 ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_curve import task_kind  # noqa: E402
from rl_levers import from_cache  # noqa: E402

from ctu.app.trainer import Trainer  # noqa: E402
from ctu.config.schema import load_config  # noqa: E402
from ctu.rollout.loop import EpisodeSpec  # noqa: E402

MINI_WRITES = {"cancel": "cancel_order", "change_address": "change_address", "return": "return_order"}


def writes(trajectory) -> list[str]:
    """The write tools an episode called (mini: every tool but get_order)."""
    return [call["function"]["name"] for m in trajectory.messages if m.get("role") == "assistant"
            for call in m.get("tool_calls") or [] if call["function"]["name"] != "get_order"]


def decision_right(kind: str, trajectory) -> bool:
    """mini: the right write for an allowed request, no write (or only refused ones) for status and refusals."""
    base, outcome = kind.split("/")
    called = writes(trajectory)
    if base == "status" or outcome == "refusal":
        return not called or trajectory.components.get("DB", 0.0) >= 1.0  # a refused write changes nothing
    return MINI_WRITES[base] in called


def tally(kinds: list[str], trajectories) -> dict[str, list[int]]:
    """kind -> [episodes, successes, wrong decisions, right decision but failed]."""
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    for kind, tr in zip(kinds, trajectories, strict=True):
        row = out[kind]
        row[0] += 1
        if tr.reward >= 1.0:
            row[1] += 1
        elif not decision_right(kind, tr):
            row[2] += 1
        else:
            row[3] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--tasks", type=int, default=64, help="train tasks drawn (the same for greedy and sampled)")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    config = load_config(args.config, [f"run.dir={args.out}", "run.overwrite=true", "trainer.eval_before_train=false",
                                       *args.overrides])
    trainer = Trainer(config)
    from_cache(trainer, Path(args.cache))
    picks = trainer.sampler.sample(args.tasks)
    kinds = [task_kind(task) for _, task in picks]
    specs = [EpisodeSpec(d, task, 0) for d, task in picks]
    s = config.sampling
    results = {"greedy": tally(kinds, trainer._rollout(specs, 0.0, seed=1)),
               f"T {s.temperature}, top_p {s.top_p}": tally(kinds, trainer._rollout(specs, s.temperature, seed=2))}
    print(f"{'kind':<24}" + "".join(f"{mode:>34}" for mode in results))
    print(f"{'':<24}" + "".join(f"{'success / wrong decision / detail':>34}" for _ in results))
    for kind in sorted(set(kinds)):
        cells = [f"{r[kind][1]:>3}/{r[kind][0]:<3} {r[kind][2]:>6} {r[kind][3]:>6}" for r in results.values()]
        print(f"{kind:<24}" + "".join(f"{c:>34}" for c in cells))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "exploration_cost.json").write_text(json.dumps({m: dict(r) for m, r in results.items()}))


if __name__ == "__main__":
    main()
