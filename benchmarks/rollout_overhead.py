"""Rollout overhead: the share of wall time spent outside the model (templating, parsing, env, bookkeeping).

tiny-random on CPU, a few hundred ``mini`` episodes with the scripted user; the model time is
the wall time inside engine calls (batched across episodes).

    python benchmarks/rollout_overhead.py [--episodes 300] [--max-tokens 24] [--turns 3] [--stop-ids 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from ctu.domains import get_domain
from ctu.engines.base import SamplingParams
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.models import load_model, load_tokenizer
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.chat import ChatFormat
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--stop-ids", type=int, default=0,
                        help="also stop turns at the first N vocabulary ids, so the random model ends turns early "
                             "and episodes go through parsing, env steps and user replies")
    args = parser.parse_args()
    tokenizer = load_tokenizer("tiny-random")
    engine = HFEngine(load_model("tiny-random"), tokenizer, max_batch_size=args.batch)
    chat = ChatFormat(tokenizer)
    domain = get_domain("mini")
    specs = [EpisodeSpec(domain, domain.tasks[i % len(domain.tasks)], i) for i in range(args.episodes)]
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=0,
                            stop_token_ids=tuple(range(args.stop_ids)))
    limits = RolloutLimits(max_turns=args.turns, max_context_tokens=2048)
    stats: dict = {}
    started = time.perf_counter()
    out = asyncio.run(rollout(specs, chat, engine, ScriptedUser(), params, limits, concurrency=args.batch,
                              max_batch_size=args.batch, stats=stats))
    wall = time.perf_counter() - started
    outside = wall - stats["model_seconds"]
    tokens = sum(sum(t.loss_mask) for t in out)
    turns = sum(t.turns for t in out)
    print(f"{len(out)} episodes, {turns} agent turns, {tokens} generated tokens, {stats['engine_calls']} engine calls")
    print(f"wall {wall:.2f}s, model {stats['model_seconds']:.2f}s, outside the model {outside:.2f}s "
          f"= {100 * outside / wall:.1f}% of wall time")


if __name__ == "__main__":
    main()
