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
4. where a decode step's time goes (``--breakdown``, the bf16 decode copy by default): torch.profiler over the
   decode steps of ``--new-tokens`` (from the first sampling to the last: no prefill), each operator's own time put
   under the products (``mm``/``addmm``/``linear``), attention (inside the decode copy's attention function),
   sampling (inside ``sample_next``) or the other operators; what the unprofiled step has beyond all operators is
   Python (the engine's loop, transformers' modules);
5. torch.profiler's top operators over a few decode steps.

``--batch`` takes several sizes (``--batch 16 32``). The variant ``lora-bf16copy-multinomial`` is the bf16 copy with
the sampler ctu had before (``torch.multinomial`` over the truncated vocabulary: one exponential per entry).

    python benchmarks/decode_roofline.py [--model smollm2-135m] [--batch 16 32] [--new-tokens 32] [--breakdown]
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import time
from contextlib import nullcontext

from ctu.engines.cpu import cpu_threads, kernel_cache

CHOICE = cpu_threads.apply()  # threads and OpenMP waits as ``ctu`` sets them: before torch loads
kernel_cache.bound()  # oneDNN's kernel caches as ``ctu`` bounds them

from unittest import mock  # noqa: E402

import torch  # noqa: E402

import ctu.engines.hf.engine as hf  # noqa: E402
from ctu.engines.base import SamplingParams  # noqa: E402
from ctu.engines.hf import decode_attention, sampling  # noqa: E402
from ctu.engines.hf.engine import HFEngine  # noqa: E402
from ctu.engines.hf.models import load_model, load_tokenizer  # noqa: E402

CLOCK = {"clock": time.perf_counter}  # --clock cpu: time.process_time (this process's CPU seconds, all threads)


def best_seconds(fn, repeats: int = 5) -> float:
    clock = CLOCK["clock"]
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = clock()
        fn()
        times.append(clock() - started)
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


def multinomial_sample_next(logits, params, generator):
    """ctu's sampler before its inverse-CDF draw: the same candidates, scattered back over the vocabulary, and
    ``torch.multinomial`` (one exponential per vocabulary entry); logprobs as the current sampler's."""
    logp = torch.log_softmax(logits.float() / params.temperature, dim=-1)
    probs = torch.zeros_like(logp)
    for rows, ids, kept in sampling.candidates(logp.exp(), params.top_p, params.top_k):
        probs[rows] = kept if ids is None else torch.zeros_like(logp[rows]).scatter(-1, ids, kept)
    if isinstance(generator, list):
        tokens = torch.cat([torch.multinomial(probs[r:r + 1], 1, generator=g).reshape(1)
                            for r, g in enumerate(generator)])
    else:
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    mass = probs.sum(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1) - mass.log()


def engine_decode(model, tokenizer, prompts, new_tokens: int, autocast, repeats: int = 3) -> dict:
    """Decode tokens/s of HFEngine.generate_sync (quickstart sampling: temperature 0.9, top-p 0.95, seeded)."""
    engine = HFEngine(model, tokenizer, max_batch_size=len(prompts),
                      decode_dtype="bfloat16" if autocast in ("copy", "multinomial") else "float32")
    engine.eos_ids = set()  # every row decodes new_tokens: a fixed amount of work

    def run(n: int) -> list:
        if engine.kv_store is not None:
            engine.kv_store.clear()
        params = SamplingParams(max_tokens=n, temperature=0.9, top_p=0.95, seed=0)
        if autocast == "fullsort":  # top-p as before its looks: every row's whole vocabulary sorted
            ctx = mock.patch.object(hf, "sample_next", functools.partial(sampling.sample_next, floor=0.0))
        elif autocast == "multinomial":  # the bf16 copy with torch.multinomial (ctu's sampler before)
            ctx = mock.patch.object(hf, "sample_next", multinomial_sample_next)
        elif autocast == "cat":  # the KV cache grown by torch.cat every step, as before its buffers
            ctx = mock.patch.object(hf, "preallocate", lambda cache, more: None)
        elif autocast == "copy":
            ctx = nullcontext()
        else:
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
        with ctx:
            return engine.generate_sync(prompts, params)

    run(1)  # warm-up (and the decode copy made)
    prefill, prefill_cpu, total, total_cpu, out = (float("inf"),) * 4 + ([],)  # type: ignore[assignment]
    for _ in range(repeats):  # the best of several: other programs on the machine only ever slow a run down
        cpu_started, started = time.process_time(), time.perf_counter()
        run(1)
        prefill, prefill_cpu = min(prefill, time.perf_counter() - started), min(prefill_cpu, time.process_time() - cpu_started)
        cpu_started, started = time.process_time(), time.perf_counter()
        out = run(new_tokens)
        total, total_cpu = min(total, time.perf_counter() - started), min(total_cpu, time.process_time() - cpu_started)
    decode = max(1e-9, total - prefill)
    steps = new_tokens - 1
    # CPU seconds (all threads) per step: what a busy machine inflates less than the wall clock
    return {"prefill_s": prefill, "decode_s": decode, "step_ms": 1e3 * decode / steps,
            "cpu_ms": 1e3 * max(0.0, total_cpu - prefill_cpu) / steps,
            "tokens_per_s": len(prompts) * steps / decode, "tokens": [c[0].token_ids for c in out], "run": run}


PRODUCTS = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::_addmm_activation", "mkldnn::_linear_pointwise")


def scoped(name: str, fn):
    def wrapped(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)
    return wrapped


def op_seconds(run, n: int) -> dict[str, float]:
    """Operator seconds a decode step by kind over ``run(n)``: torch.profiler, the engine's attention functions and
    its sampler inside named scopes, whose own time counts to them; only the operators that start between the
    first sampling and the last (``n - 1`` whole steps: no prefill)."""
    from transformers.modeling_utils import AttentionInterface

    names = [decode_attention.register(kernel) for kernel in decode_attention.KERNELS]
    table = AttentionInterface._global_mapping
    attention = {k: scoped("attention", table[k]) for k in (*names, "sdpa")}
    with mock.patch.dict(table, attention), mock.patch.object(hf, "sample_next", scoped("sampling", hf.sample_next)):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run(n)
    events = prof.events()
    samplings = sorted(e.time_range.start for e in events if e.name == "sampling")
    first, last = samplings[0], samplings[-1]
    kinds = dict.fromkeys(("products", "attention", "sampling", "other operators"), 0.0)
    for event in events:
        if not first <= event.time_range.start < last:
            continue
        scope, up = None, event
        while up is not None and scope is None:
            scope = up.name if up.name in ("attention", "sampling") else None
            up = up.cpu_parent
        kind = scope or ("products" if event.name in PRODUCTS else "other operators")
        kinds[kind] += event.self_cpu_time_total / 1e6
    return {k: v / max(1, len(samplings) - 1) for k, v in kinds.items()}


def breakdown(result: dict, new_tokens: int, step_ms: float, repeats: int = 2) -> dict[str, float]:
    """``step_ms`` split by kind: each kind's operator time a decode step under the profiler (the run of
    ``repeats`` with the least operator time); Python and the rest is the unprofiled step beyond all of them."""
    run = result["run"]
    op_seconds(run, 2)  # warm-up of the profiler
    parts = min((op_seconds(run, new_tokens) for _ in range(repeats)), key=lambda r: sum(r.values()))
    parts = {k: 1e3 * v for k, v in parts.items()}
    ops = sum(parts.values())
    if ops > step_ms:  # the profiler's own cost inside the operators' times: scaled to the step
        return {**{k: v * step_ms / ops for k, v in parts.items()}, "Python and the rest": 0.0}
    return {**parts, "Python and the rest": step_ms - ops}


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
    ap.add_argument("--batch", type=int, nargs="+", default=[16])
    ap.add_argument("--prompt-tokens", type=int, default=400)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed decodes a variant; the best is reported")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: the machine's rates and each step's cost in CPU seconds (with --threads 1, what one "
                         "core does however busy the machine is; 'of roofline' then compares CPU time)")
    ap.add_argument("--breakdown", nargs="?", const="lora-bf16copy", default=None,
                    help="where a decode step's time goes for this variant (default lora-bf16copy)")
    ap.add_argument("--prompts", choices=["mini", "synthetic"], default="mini",
                    help="mini: the first agent turn of mini test tasks (compact template); synthetic: a repeated text "
                         "of --prompt-tokens tokens")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's); 1 on a crowded machine, where threads wait on each other")
    ap.add_argument("--variants", nargs="+", default=["fp32-cat", "fp32", "lora", "lora-bf16copy", "bf16"],
                    help="engine measurements to run: fp32-cat (KV grown by torch.cat) fp32 fullsort (top-p by sorting "
                         "every row) autocast bf16 (bf16 weights) lora (fp32, LoRA unmerged) lora-bf16copy (the same "
                         "with engine.decode_dtype=bfloat16) lora-bf16copy-multinomial (the same, torch.multinomial)")
    args = ap.parse_args()
    if args.clock == "cpu":
        CLOCK["clock"] = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(CHOICE.message)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} (a busy machine measures low)")
    bw = bandwidth_gbs()
    dtypes = (torch.float32, torch.bfloat16)
    square = {dt: matmul_gflops(1024, 1024, 1024, dt) for dt in dtypes}
    rates = {(b, dt): matmul_gflops(b, 576, 1536, dt) for b in args.batch for dt in dtypes}
    print(f"memory bandwidth (copy, read + write): {bw:.1f} GB/s")
    for dt in dtypes:
        shaped = ", ".join(f"{rates[(b, dt)]:.1f} at {b}x576x1536" for b in args.batch)
        print(f"matmul {str(dt).split('.')[-1]}: {square[dt]:.1f} GFLOP/s at 1024^3, {shaped}")

    model = load_model(args.model, dtype=torch.float32, device="cpu")
    model.eval()
    tokenizer = load_tokenizer(args.model)
    n_params = sum(p.numel() for p in model.parameters())
    batches = {}
    for batch in args.batch:
        prompts = (mini_prompts(tokenizer, batch) if args.prompts == "mini"
                   else prompts_for(tokenizer, batch, args.prompt_tokens))
        batches[batch] = [prompts[i % len(prompts)] for i in range(batch)]  # fewer tasks than rows: again from the first

    def context(batch: int) -> int:
        """The cached positions a step of ``batch`` rows attends over, on average: its padded prompt (as long as its
        longest) and half the new tokens."""
        return max(map(len, batches.get(batch, batches[args.batch[0]]))) + args.new_tokens // 2

    print(f"\n{args.model}: {n_params / 1e6:.1f}M parameters, context ~{context(args.batch[0])} tokens")
    print(f"{'roofline':<24} {'MB/step':>8} {'GFLOP/step':>10} {'ms/step':>8} {'bound':>8} {'tokens/s':>9}")
    bound_tps = {}
    for batch in (1, *args.batch):
        for dt, wbytes in zip(dtypes, (4, 2), strict=True):
            name = str(dt).split(".")[-1]
            cost = decode_cost(model.config, n_params, batch, context(batch), wbytes, wbytes)
            # the decode-shaped matmul rate: what small products reach here, not the square peak
            rate = rates.get((batch, dt), rates[(args.batch[0], dt)])
            seconds, bound = roofline_seconds(cost, bw * 1e9, rate * 1e9)
            bound_tps[(batch, name)] = batch / seconds
            print(f"batch {batch:>2} {name:<15} {cost['bytes'] / 1e6:>8.0f} {cost['flops'] / 1e9:>10.2f} "
                  f"{1e3 * seconds:>8.1f} {bound:>8} {batch / seconds:>9.0f}")

    makers = {"fp32": lambda: ("fp32", model, False), "autocast": lambda: ("fp32 + bf16 autocast", model, True),
              "bf16": lambda: ("bf16 weights", copy.deepcopy(model).to(torch.bfloat16), False),
              "lora": lambda: ("fp32 LoRA (as ctu train)", lora_wrapped(model), False),
              "fullsort": lambda: ("fp32, full-sort top-p", model, "fullsort"),
              "fp32-cat": lambda: ("fp32, KV by torch.cat", model, "cat"),
              "lora-bf16copy": lambda: ("LoRA, bf16 decode copy", lora_wrapped(model), "copy"),
              "lora-bf16copy-multinomial": lambda: ("LoRA, bf16 copy, multinomial", lora_wrapped(model), "multinomial")}
    wanted = list(dict.fromkeys(args.variants + ([args.breakdown] if args.breakdown else [])))
    variants = {v: makers[v]() for v in wanted}
    for batch in args.batch:
        prompts = batches[batch]
        print(f"\nHFEngine decode, batch {batch}, {args.new_tokens} new tokens (temperature 0.9, top-p 0.95), "
              f"prompts: {args.prompts}, {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
              f"best of {args.repeats}")
        print(f"{'variant':<30} {'prefill s':>9} {'ms/step':>8} {'CPU ms/step':>11} {'tokens/s':>9} "
              f"{'of roofline':>11}")
        tokens, results = {}, {}
        for key in args.variants:
            name, m, autocast = variants[key]
            r = results[key] = engine_decode(m, tokenizer, prompts, args.new_tokens, autocast, args.repeats)
            tokens[name] = r["tokens"]
            ideal = bound_tps[(batch, "bfloat16" if "bf16" in name else "float32")]
            rate = r["tokens_per_s"] if args.clock == "wall" else 1e3 * batch / max(1e-9, r["cpu_ms"])
            print(f"{name:<30} {r['prefill_s']:>9.2f} {r['step_ms']:>8.1f} {r['cpu_ms']:>11.1f} "
                  f"{r['tokens_per_s']:>9.0f} {rate / ideal:>10.0%}")
        if "fp32, KV by torch.cat" in tokens and "fp32" in tokens:
            same = tokens["fp32, KV by torch.cat"] == tokens["fp32"]
            print(f"fp32 with buffers samples the same tokens as with torch.cat: {same}")
        if args.breakdown:
            name, m, autocast = variants[args.breakdown]
            r = results.get(args.breakdown) or engine_decode(m, tokenizer, prompts, args.new_tokens, autocast,
                                                              args.repeats)
            step = r["step_ms"] if args.clock == "wall" else r["cpu_ms"]
            parts = breakdown(r, args.new_tokens, step)
            print(f"where a step goes ({name}, batch {batch}, {step:.1f} ms a step, {args.clock} clock): " + ", ".join(
                f"{k} {v:.1f} ms ({v / step:.0%})" for k, v in parts.items()))
    if not args.no_profile:
        print(f"\ntop operators over 6 decode steps (fp32, batch {args.batch[-1]}; the first row also includes "
              "prefill):")
        print(profile_decode(model, tokenizer, prompts))


if __name__ == "__main__":
    main()
