"""Synchronous vs asynchronous RL at a GPU node's cost ratios, on one CPU: ctu's own scheduler, queue and loop.

What runs for real: the producer (``RolloutProducer`` behind ``AsyncPool``), its queue, the staleness filter and
``AsyncRollouts.collect`` (k > 0), the synchronous ``collect_now`` (k = 0), the agent loop over ``mini``'s tasks
with the SmolLM2 chat template, the generation batcher, and the pool's sleep/wake around an update. What is slept
instead of computed, from a cost model fitted to the GPU figures in docs/gpu.md and docs/async.md:

- decode: ``--tokens`` tokens a turn at ``--decode`` tokens/s per sequence; a batch larger than the engines'
  ``--slots`` sequences per GPU takes proportionally longer; one batch at a time per engine (its lock);
- the user simulator: each reply waits a latency drawn uniformly in [``--user-min``, ``--user-max``] s; each
  session lasts 2..``--turns`` turns (drawn), so some groups straggle;
- the update: episodes x ``--episode-tokens`` at ``--update`` tokens/s per trainer GPU; a sync ``--sync`` s.

Placements at N simulated GPUs: colocated (every GPU generates and trains; the engine sleeps through the update,
so the producer pauses then) and split (N/2 engine GPUs, N/2 trainer GPUs; the engine stays awake). Every sleep is
multiplied by ``--scale`` (0.02: 50x faster than the simulated time); the figures are given in simulated time.

    python benchmarks/async_cost_model.py --gpus 1 8 64 --staleness 0 1 2 --inflight finish abort continue --steps 5

Prints a table: steps/hour (steady steps 2..), speed-up over k = 0 of the same placement, trainer and engine idle
fractions, mean staleness and dropped groups. Figures and assumptions: docs/async.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ctu.app.async_loop import AsyncRollouts
from ctu.app.sync_loop import TrainingRewards, collect_now
from ctu.app.task_sampler import TaskSampler
from ctu.config.schema import load_config
from ctu.distributed.async_pool import AsyncPool
from ctu.distributed.pool import LocalPool
from ctu.domains import get_domain
from ctu.engines.base import Completion, Engine, SamplingParams
from ctu.episode.users.base import STOP, UserSession, UserSimulator
from ctu.rollout.loop import RolloutLimits


@dataclass
class Costs:
    decode: float = 60.0  # tokens/s per sequence (one H100, a 3B model, batch within its slots)
    tokens: int = 150  # sampled tokens a turn
    slots: int = 64  # sequences a GPU decodes at that rate
    user_min: float = 0.5  # s a user reply takes, uniform in [user_min, user_max]
    user_max: float = 2.5
    turns: int = 8  # a session lasts 2..turns agent turns
    update: float = 10_000.0  # trained tokens/s per trainer GPU (3B LoRA)
    episode_tokens: int = 8_000
    sync: float = 3.0  # s a weight sync takes
    scale: float = 0.02  # real seconds per simulated second


class CostEngine(Engine):
    """Sleeps each batch's decode time under a lock shared with weight loads; answers a short question.

    ``inflight`` (``trainer.inflight``): "finish" holds the lock for a whole call, so a load waits for the batch in
    flight; "abort" and "continue" decode ``CHUNK`` tokens at a time and let a waiting load in between (the hf
    engine's token boundary, vLLM's pause): "abort" then re-samples the call from its first token on the new
    weights, "continue" goes on, its tokens stamped with the version that sampled them."""

    CHUNK = 10  # simulated tokens between two chances for a waiting load

    def __init__(self, chat, costs: Costs, gpus: int, inflight: str = "finish"):
        self.ids = tuple(chat.encode("Which order?") + [chat.stop_token_ids[0]])
        self.costs, self.gpus, self.inflight = costs, gpus, inflight
        self.lock = threading.Condition()
        self.loads_waiting = 0
        self.weights_version = 0
        self.busy = 0.0  # simulated seconds spent decoding or loading
        self.resampled = 0  # simulated tokens thrown away by "abort"
        self.asleep = False

    async def generate(self, prompts, params, seeds=None):
        return await asyncio.to_thread(self._generate, len(prompts))

    def _generate(self, n: int):
        c = self.costs
        per_token = 1 / c.decode * max(1, -(-n // (c.slots * self.gpus)))
        versions: list[int] = []  # the version of each simulated token
        while len(versions) < c.tokens:
            with self.lock:  # released between chunks unless trainer.inflight=finish (one chunk: the whole call)
                if self.asleep:
                    raise RuntimeError("generation on a sleeping engine")
                if self.loads_waiting and self.inflight != "finish":
                    self.lock.wait_for(lambda: not self.loads_waiting)  # the load goes first
                    if self.inflight == "abort" and versions:
                        self.resampled += len(versions)
                        versions = []
                    continue
                left = c.tokens - len(versions)
                step = left if self.inflight == "finish" else min(self.CHUNK, left)
                time.sleep(step * per_token * c.scale)
                self.busy += step * per_token
                versions += [self.weights_version] * step
        # the returned ids take the versions of the simulated tokens at their share of the completion
        stamps = tuple(versions[i * len(versions) // len(self.ids)] for i in range(len(self.ids)))
        return [[Completion(self.ids, (-0.5,) * len(self.ids), "stop", stamps[-1],
                            stamps if len(set(stamps)) > 1 else None)] for _ in range(n)]

    def update_weights(self, named_tensors, version=None):
        self.loads_waiting += 1  # seen by a call in flight at its next chunk (one loading thread: the trainer's)
        with self.lock:
            try:
                time.sleep(self.costs.sync * self.costs.scale)
                self.busy += self.costs.sync
                self.weights_version = version
            finally:
                self.loads_waiting -= 1
                self.lock.notify_all()

    def sleep(self):
        self.asleep = True

    def wake_up(self, tags=None):
        self.asleep = False


class LatencyUser(UserSimulator):
    """Replies after a drawn latency; ends its session after a drawn number of turns."""

    def __init__(self, costs: Costs, seed: int):
        self.costs, self.rng = costs, random.Random(seed)

    def start(self, domain, task, seed=0):
        c, rng = self.costs, random.Random(seed)
        turns, delays = rng.randint(2, c.turns), [rng.uniform(c.user_min, c.user_max) for _ in range(c.turns + 1)]

        class Session(UserSession):
            said = 0

            async def reply(self, agent_message):
                await asyncio.sleep(delays[self.said] * c.scale)
                self.said += 1
                return STOP if self.said >= turns else "Order O1001, please."

        return Session()


def run_mode(chat, costs: Costs, gpus: int, placement: str, k: int, steps: int, tasks: int, samples: int,
             inflight: str = "finish") -> dict:
    engine_gpus = gpus if placement == "colocated" else max(1, gpus // 2)
    trainer_gpus = gpus if placement == "colocated" else max(1, gpus // 2)
    config = load_config(None, [f"trainer.tasks_per_step={tasks}", f"trainer.samples_per_task={samples}",
                                f"trainer.max_steps={steps + 1}", f"trainer.max_staleness={k}", "trainer.tis_cap=2.0",
                                f"env.max_turns={costs.turns + 1}", "sampling.max_tokens=8",
                                f"trainer.inflight={inflight}"])
    engine = CostEngine(chat, costs, engine_gpus, inflight)
    engine.sleep_mode = placement == "colocated"  # it frees its GPU through the update (ctu train refuses k > 0 there)
    inner = LocalPool(engine, chat, LatencyUser(costs, 0), RolloutLimits(max_turns=costs.turns + 1),
                      concurrency=4096, max_batch_size=4096)
    pool = AsyncPool(inner) if k else inner
    trainer = SimpleNamespace(config=config, step=0, pool=pool, sync=SimpleNamespace(version=0), sampler=TaskSampler([get_domain("mini")], [1.0], seed=0),
                              rewards=lambda b: TrainingRewards(tuple(0.0 for _ in b), tuple(float(t.sample) for t in b)))
    trainer._rollout = lambda specs, temperature, seed: pool.run(specs, SamplingParams(temperature=temperature,
                                                                                      seed=seed), seed)
    rollouts = AsyncRollouts(trainer) if k else None
    update_s = tasks * samples * costs.episode_tokens / (costs.update * trainer_gpus)
    rows = []
    try:
        for step in range(1, steps + 1):
            trainer.step = step
            started, busy0 = time.perf_counter(), engine.busy
            _, _, _, chosen, _ = rollouts.collect() if rollouts is not None else collect_now(trainer)
            collected = time.perf_counter()
            if placement == "colocated":
                pool.sleep()  # AsyncPool: the producer pauses (its groups in flight finish) before the engine sleeps
            time.sleep(update_s * costs.scale)
            if placement == "colocated":
                pool.wake_up()
            engine.update_weights([], version=step)
            wall = (time.perf_counter() - started) / costs.scale
            metrics = rollouts.step_metrics(time.perf_counter() - started) if rollouts is not None else {}
            rows.append({"step": step, "s": wall, "rollout_wait_s": (collected - started) / costs.scale,
                         "trainer_idle": ((collected - started) / costs.scale) / wall,
                         "engine_idle": max(0.0, 1 - (engine.busy - busy0) / wall), "groups": len(chosen),
                         "staleness": metrics.get("staleness_mean", 0.0),
                         "dropped": metrics.get("dropped_groups", 0)})
    finally:
        if rollouts is not None and rollouts.producer is not None:
            rollouts.producer.stop()
    steady = rows[1:] or rows
    mean = lambda key: sum(r[key] for r in steady) / len(steady)  # noqa: E731
    return {"gpus": gpus, "placement": placement, "k": k, "inflight": inflight, "update_s": update_s, "rows": rows,
            "resampled_tokens": engine.resampled,
            "steps_per_hour": 3600 / mean("s"), "trainer_idle": mean("trainer_idle"),
            "engine_idle": mean("engine_idle"), "staleness": mean("staleness"),
            "dropped": sum(r["dropped"] for r in steady)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--placements", nargs="+", default=["colocated", "split"])
    parser.add_argument("--inflight", nargs="+", default=["finish"], choices=["finish", "abort", "continue"],
                        help="trainer.inflight modes to run at k > 0 (partial rollouts)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=16, help="trainer.tasks_per_step")
    parser.add_argument("--samples", type=int, default=4, help="trainer.samples_per_task")
    parser.add_argument("--out", type=Path, default=None, help="write every step's figures here (JSON)")
    for name, value in vars(Costs()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args(argv)
    costs = Costs(**{name: getattr(args, name) for name in vars(Costs())})
    from transformers import AutoTokenizer

    from ctu.engines.hf.models import smollm2_tokenizer_dir
    from ctu.rollout.chat import ChatFormat

    chat = ChatFormat(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))
    print(f"cost model: {json.dumps(vars(costs))}; {args.tasks} x {args.samples} episodes a step, "
          f"steps 2..{args.steps} averaged", flush=True)
    print("| GPUs | placement | k | in flight | update s | steps/hour | speed-up | trainer idle | engine idle | "
          "staleness | dropped | re-sampled s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for gpus in args.gpus:
        for placement in args.placements:
            if placement == "split" and gpus < 2:
                continue
            base = None
            for k in args.staleness:
                for inflight in args.inflight if k else ["finish"]:
                    r = run_mode(chat, costs, gpus, placement, k, args.steps, args.tasks, args.samples, inflight)
                    base = r["steps_per_hour"] if k == 0 else base
                    speed = f"{r['steps_per_hour'] / base:.2f}x" if base else "-"
                    lost = r["resampled_tokens"] / costs.decode  # simulated sequence-seconds thrown away
                    print(f"| {gpus} | {placement} | {k} | {inflight if k else '-'} | {r['update_s']:.1f} | "
                          f"{r['steps_per_hour']:.1f} | {speed} | {r['trainer_idle']:.2f} | {r['engine_idle']:.2f} | "
                          f"{r['staleness']:.2f} | {r['dropped']} | {lost:.0f} |", flush=True)
                    results.append(r)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"costs": vars(costs), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
