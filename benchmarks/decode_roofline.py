"""How far ctu's hf engine is from what this CPU can do for batched decode (SmolLM2-135M by default), in < 2 min.

1. the machine: achievable memory bandwidth (a large tensor copy) and matmul GFLOP/s in fp32 and bf16, both for a
   large square product (the peak) and for the decode-shaped product (batch x hidden by hidden x intermediate);
2. the roofline of one decode step at batch 1 and 16: bytes read (every weight once, the tied embedding as the LM
   head, plus the KV cache) and FLOPs (2 per weight per row, plus attention over the context); the step takes at
   least max(bytes / bandwidth, FLOPs / matmul rate);
3. measured decode tokens/s of ``HFEngine.generate_sync`` (end-of-sequence ignored, so every row decodes
   ``--new-tokens``; the prefill is timed apart and subtracted) in fp32 with the KV cache grown by ``torch.cat`` (as
   before its buffers: ``fp32-cat``) and in buffers, on the LoRA-wrapped model ``ctu train`` decodes with (peft,
   adapters not merged), with the engine's bf16 decode copy of it (``engine.decode_dtype=bfloat16``), with bf16
   weights, and under bf16 autocast; each against the roofline of its dtype;
4. torch.profiler's top operators over a few decode steps.

    python benchmarks/decode_roofline.py [--model smollm2-135m] [--batch 16] [--prompt-tokens 400] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import time
from contextlib import nullcontext

from ctu.engines.cpu import cpu_threads

CHOICE = cpu_threads.apply()  # threads and OpenMP waits as ``ctu`` sets them: before torch loads

import torch  # noqa: E402

from ctu.engines.base import SamplingParams  # noqa: E402
from ctu.engines.hf.engine import HFEngine  # noqa: E402
from ctu.engines.hf.models import load_model, load_tokenizer  # noqa: E402


def best_seconds(fn, repeats: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def bandwidth_gbs(megabytes: int = 256) -> float:
    """Read + write bytes per second of a copy between two buffers far larger than the caches."""
    a = torch.ones(megabytes * 2 ** 20 // 4)
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / best_seconds(lambda: b.copy_(a)) / 1e9


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype, repeats: int = 5) -> float:
    x, w = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    inner = max(1, int(2e8 // (2 * m * k * n)))  # small products: repeat to time a few ms

    def run() -> None:
        for _ in range(inner):
            torch.mm(x, w)

    return 2 * m * k * n * inner / best_seconds(run, repeats) / 1e9


def decode_cost(config, n_params: int, batch: int, context: int, weight_bytes: int, kv_bytes: int) -> dict[str, float]:
    """Bytes read and FLOPs of one decode step (``batch`` rows, ``context`` tokens each already in the cache).

    Weights: each read once per step whatever the batch (the tied embedding is read whole as the LM head; the
    embedding lookup itself is negligible); FLOPs: 2 per weight per row, plus q.k and p.v over the context."""
    layers, hidden = config.num_hidden_layers, config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    kv_read = 2 * layers * context * kv_heads * head_dim * kv_bytes * batch
    attention = 4 * layers * context * config.num_attention_heads * head_dim * batch
    return {"bytes": n_params * weight_bytes + kv_read, "flops": 2 * n_params * batch + attention,
            "weight_bytes": n_params * weight_bytes, "kv_bytes": kv_read}


def roofline_seconds(cost: dict[str, float], bandwidth: float, flops: float) -> tuple[float, str]:
    """The step's lower bound and what bounds it (``bandwidth`` in bytes/s, ``flops`` in FLOP/s)."""
    memory, compute = cost["bytes"] / bandwidth, cost["flops"] / flops
    return (memory, "memory") if memory >= compute else (compute, "compute")


def prompts_for(tokenizer, batch: int, prompt_tokens: int) -> list[list[int]]:
    """One shared prefix (like the system prompt and tools) and a different short tail per row."""
    text = " ".join(["You are a customer service agent for a small online store; use the tools."] * 64)
    prefix = tokenizer.encode(text)[: prompt_tokens - 8]
    return [prefix + tokenizer.encode(f" Where is my order O{1001 + i}?")[:8] for i in range(batch)]


def mini_prompts(tokenizer, batch: int) -> list[list[int]]:
    """The first agent turn of ``batch`` mini test tasks, rendered as the quickstart renders them (compact
    template): what a rollout's first decode sees."""
    from ctu.domains import get_domain
    from ctu.episode.data.conversations import gold_conversations
    from ctu.rollout.chat import ChatFormat

    chat = ChatFormat(tokenizer, template="compact")
    domain = get_domain("mini")
    prompts = []
    for conversation in gold_conversations(domain, list(domain.split("test"))[:batch]):
        first = next(i for i, m in enumerate(conversation.messages) if m.get("role") == "assistant")
        prompts.append(chat.prompt_ids(conversation.messages[:first], conversation.tools))
    return prompts


def engine_decode(model, tokenizer, prompts, new_tokens: int, autocast: bool) -> dict[str, float]:
    """Decode tokens/s of HFEngine.generate_sync (quickstart sampling: temperature 0.9, top-p 0.95, seeded)."""
    engine = HFEngine(model, tokenizer, max_batch_size=len(prompts),
                      decode_dtype="bfloat16" if autocast == "copy" else "float32")
    engine.eos_ids = set()  # every row decodes new_tokens: a fixed amount of work

    def run(n: int) -> list:
        if engine.kv_store is not None:
            engine.kv_store.clear()
        params = SamplingParams(max_tokens=n, temperature=0.9, top_p=0.95, seed=0)
        if autocast == "fullsort":  # top-p as before: every row's whole vocabulary sorted
            from unittest import mock

            import ctu.engines.hf.engine as hf

            ctx = mock.patch.object(hf, "nucleus", functools.partial(hf.nucleus, first=10 ** 9))
        elif autocast == "cat":  # the KV cache grown by torch.cat every step, as before its buffers
            from unittest import mock

            import ctu.engines.hf.engine as hf

            ctx = mock.patch.object(hf, "preallocate", lambda cache, more: None)
        elif autocast == "copy":
            ctx = nullcontext()
        else:
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
        with ctx:
            return engine.generate_sync(prompts, params)

    run(1)  # warm-up (and the decode copy made)
    cpu_started, started = time.process_time(), time.perf_counter()
    run(1)
    prefill, prefill_cpu = time.perf_counter() - started, time.process_time() - cpu_started
    cpu_started, started = time.process_time(), time.perf_counter()
    out = run(new_tokens)
    total, total_cpu = time.perf_counter() - started, time.process_time() - cpu_started
    decode = max(1e-9, total - prefill)
    steps = new_tokens - 1
    # CPU seconds (all threads) per step: what a busy machine inflates less than the wall clock
    return {"prefill_s": prefill, "decode_s": decode, "step_ms": 1e3 * decode / steps,
            "cpu_ms": 1e3 * max(0.0, total_cpu - prefill_cpu) / steps,
            "tokens_per_s": len(prompts) * steps / decode, "tokens": [c[0].token_ids for c in out]}


def profile_decode(model, tokenizer, prompts, steps: int = 6, rows: int = 12) -> str:
    from torch.profiler import ProfilerActivity, profile

    engine = HFEngine(model, tokenizer, max_batch_size=len(prompts))
    engine.eos_ids = set()
    params = SamplingParams(max_tokens=steps, temperature=0.9, top_p=0.95, seed=0)
    engine.generate_sync(prompts, params)
    engine.kv_store.clear()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.generate_sync(prompts, params)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=40)


def lora_wrapped(model):
    """The model as ``ctu train`` decodes it: peft LoRA adapters (rank 16, the quickstart's modules), not merged."""
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(copy.deepcopy(model), LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                              lora_dropout=0.0))
    wrapped.eval()
    return wrapped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=400)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--prompts", choices=["mini", "synthetic"], default="mini",
                    help="mini: the first agent turn of mini test tasks (compact template); synthetic: a repeated text "
                         "of --prompt-tokens tokens")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's); 1 on a crowded machine, where threads wait on each other")
    ap.add_argument("--variants", nargs="+", default=["fp32-cat", "fp32", "lora", "lora-bf16copy", "bf16"],
                    help="engine measurements to run: fp32-cat (KV grown by torch.cat) fp32 fullsort (top-p by sorting "
                         "every row) autocast bf16 (bf16 weights) lora (fp32, LoRA unmerged) lora-bf16copy (the same "
                         "with engine.decode_dtype=bfloat16)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(CHOICE.message)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} (a busy machine measures low)")
    bw = bandwidth_gbs()
    rates = {str(dt).split(".")[-1]: (matmul_gflops(1024, 1024, 1024, dt), matmul_gflops(args.batch, 576, 1536, dt))
             for dt in (torch.float32, torch.bfloat16)}
    print(f"memory bandwidth (copy, read + write): {bw:.1f} GB/s")
    for name, (square, decode) in rates.items():
        print(f"matmul {name}: {square:.1f} GFLOP/s at 1024^3, {decode:.1f} GFLOP/s at {args.batch}x576x1536")

    model = load_model(args.model, dtype=torch.float32, device="cpu")
    model.eval()
    tokenizer = load_tokenizer(args.model)
    n_params = sum(p.numel() for p in model.parameters())
    context = args.prompt_tokens + args.new_tokens // 2  # with --prompts mini: ~the mini prompts' length
    print(f"\n{args.model}: {n_params / 1e6:.1f}M parameters, context ~{context} tokens")
    print(f"{'roofline':<24} {'MB/step':>8} {'GFLOP/step':>10} {'ms/step':>8} {'bound':>8} {'tokens/s':>9}")
    bound_tps = {}
    for batch in (1, args.batch):
        for name, wbytes in (("float32", 4), ("bfloat16", 2)):
            cost = decode_cost(model.config, n_params, batch, context, wbytes, wbytes)
            # the decode-shaped matmul rate: what small products reach here, not the square peak
            seconds, bound = roofline_seconds(cost, bw * 1e9, rates[name][1] * 1e9)
            bound_tps[(batch, name)] = batch / seconds
            print(f"batch {batch:>2} {name:<15} {cost['bytes'] / 1e6:>8.0f} {cost['flops'] / 1e9:>10.2f} "
                  f"{1e3 * seconds:>8.1f} {bound:>8} {batch / seconds:>9.0f}")

    prompts = (mini_prompts(tokenizer, args.batch) if args.prompts == "mini"
               else prompts_for(tokenizer, args.batch, args.prompt_tokens))
    print(f"\nprompts: {args.prompts}, {min(map(len, prompts))}-{max(map(len, prompts))} tokens")
    makers = {"fp32": lambda: ("fp32", model, False), "autocast": lambda: ("fp32 + bf16 autocast", model, True),
              "bf16": lambda: ("bf16 weights", copy.deepcopy(model).to(torch.bfloat16), False),
              "lora": lambda: ("fp32 LoRA (as ctu train)", lora_wrapped(model), False),
              "fullsort": lambda: ("fp32, full-sort top-p", model, "fullsort"),
              "fp32-cat": lambda: ("fp32, KV by torch.cat", model, "cat"),
              "lora-bf16copy": lambda: ("LoRA, bf16 decode copy", lora_wrapped(model), "copy")}
    variants = [makers[v]() for v in args.variants]
    print(f"\nHFEngine decode, batch {args.batch}, {args.new_tokens} new tokens (temperature 0.9, top-p 0.95)")
    print(f"{'variant':<26} {'prefill s':>9} {'ms/step':>8} {'CPU ms/step':>11} {'tokens/s':>9} {'of roofline':>11}")
    tokens = {}
    for name, m, autocast in variants:
        r = engine_decode(m, tokenizer, prompts, args.new_tokens, autocast)
        tokens[name] = r["tokens"]
        ideal = bound_tps[(args.batch, "bfloat16" if "bf16" in name else "float32")]
        print(f"{name:<26} {r['prefill_s']:>9.2f} {r['step_ms']:>8.1f} {r['cpu_ms']:>11.1f} {r['tokens_per_s']:>9.0f} "
              f"{r['tokens_per_s'] / ideal:>10.0%}")
    if "fp32, KV by torch.cat" in tokens and "fp32" in tokens:
        same = tokens["fp32, KV by torch.cat"] == tokens["fp32"]
        print(f"fp32 with buffers samples the same tokens as with torch.cat: {same}")
    if not args.no_profile:
        print(f"\ntop operators over 6 decode steps (fp32, batch {args.batch}; the first row also includes prefill):")
        print(profile_decode(model, tokenizer, prompts))


if __name__ == "__main__":
    main()
