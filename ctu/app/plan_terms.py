"""The terms of :mod:`ctu.app.plan`: model shapes (parameters, LoRA, activations, KV cache) and what a weight sync and a
vLLM engine hold beside the trainer, as small pure functions of the shapes and the config (no torch, nothing loaded).

vLLM (read in vllm-project/vllm): ``EngineArgs`` sets ``max_num_batched_tokens`` for the ``LLM`` class to 16384 on a
device of >= 70 GiB that is not an A100, 8192 otherwise (vllm/engine/arg_utils.py); the profiling run that sizes the KV
cache runs that many tokens. CUDA graphs are captured after the KV cache is allocated (``compile_or_warm_up_model``,
vllm/v1/worker/gpu_worker.py) and are not counted in ``gpu_memory_utilization`` unless
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``; sleep (either level) frees only the weights and KV cache pools, so the
graphs stay while the engine sleeps. Level 1 offloads the weights to pinned host RAM, level 2 discards them.

A sync wakes a sleeping engine in steps (ctu/engines/vllm/engine.py, ctu/train/sync.py): ``update_weights`` wakes the weights,
loads the stream, then wakes the KV cache; ``update_adapter`` writes the adapter to host first, then wakes both; Ray
trainer ranks gather and pack the merged weights to the object store before any engine is asked to load them. So what
the engine holds while the sync's transient lives depends on the path (:func:`sync_engine_state`). At the end of a
run the export follows the final evaluation with the engine awake (the pool closes after it: ctu/app/trainer.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ctu.config.schema import engines_sleep, weight_sync_mode

GiB = 1 << 30
CUDA_CONTEXT = int(0.75 * GiB)  # one process's CUDA context (and cuBLAS workspace) on a GPU
VLLM_CUDA_GRAPHS = 1 * GiB  # an estimate: vLLM logs 0.3-1 GiB of graph capture for 3-8B models at its default sizes
VLLM_BATCHED_TOKENS = {False: 8192, True: 16384}  # the LLM class's default, by "device of >= 70 GiB"
VLLM_LARGE_DEVICE_GIB = 70


@dataclass(frozen=True)
class Arch:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    head_dim: int | None = None
    qkv_bias: bool = False  # Qwen2/2.5
    qk_norm: bool = False  # Qwen3

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads


ARCHITECTURES = {  # from each model's config.json on the Hugging Face hub
    "qwen2.5-0.5b": Arch(896, 24, 14, 2, 4864, 151936, True, qkv_bias=True),
    "qwen2.5-1.5b": Arch(1536, 28, 12, 2, 8960, 151936, True, qkv_bias=True),
    "qwen2.5-3b": Arch(2048, 36, 16, 2, 11008, 151936, True, qkv_bias=True),
    "qwen2.5-7b": Arch(3584, 28, 28, 4, 18944, 152064, False, qkv_bias=True),
    "qwen3-4b": Arch(2560, 36, 32, 8, 9728, 151936, True, head_dim=128, qk_norm=True),
    "qwen3-4b-instruct-2507": Arch(2560, 36, 32, 8, 9728, 151936, True, head_dim=128, qk_norm=True),  # Qwen3-4B's shapes
    "qwen3-8b": Arch(4096, 36, 32, 8, 12288, 151936, False, head_dim=128, qk_norm=True),
    "smollm2-135m": Arch(576, 30, 9, 3, 1536, 49152, True),
    "tiny-random": Arch(64, 2, 4, 2, 128, 49152, True, head_dim=16),  # ctu.engines.hf.models._build_tiny_random
}


def arch_from_config(cfg: dict) -> Arch:
    """An :class:`Arch` from a Hugging Face ``config.json`` dict (Llama, Mistral, Qwen2, Qwen3 shapes)."""
    model_type = cfg.get("model_type", "")
    return Arch(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
                kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
                intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                tied=bool(cfg.get("tie_word_embeddings", False)), head_dim=cfg.get("head_dim"),
                qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias")), qk_norm=model_type == "qwen3")


def resolve_arch(path: str) -> Arch:
    """Shapes for ``model.path`` without loading weights: local config.json, the table, or the local HF cache."""
    local = Path(path).expanduser()
    if (local / "config.json").is_file():
        return arch_from_config(json.loads((local / "config.json").read_text()))
    key = path.rstrip("/").rsplit("/", 1)[-1].lower().removesuffix("-instruct")
    if key in ARCHITECTURES:
        return ARCHITECTURES[key]
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
        if isinstance(cached, str):
            return arch_from_config(json.loads(Path(cached).read_text()))
    except Exception:  # noqa: BLE001 - not a hub name, no cache: fall through to the one-line error
        pass
    raise ValueError(f"model.path '{path}': unknown architecture (known: {', '.join(ARCHITECTURES)}); "
                     "give a local directory with a config.json")


def parameter_count(a: Arch) -> int:
    q, kv = a.heads * a.hd, a.kv_heads * a.hd
    attn = a.hidden * q + 2 * a.hidden * kv + q * a.hidden
    attn += (q + 2 * kv) if a.qkv_bias else 0
    attn += 2 * a.hd if a.qk_norm else 0
    layer = attn + 3 * a.hidden * a.intermediate + 2 * a.hidden
    return a.vocab * a.hidden * (1 if a.tied else 2) + a.layers * layer + a.hidden


def _module_shapes(a: Arch) -> dict[str, tuple[int, int]]:
    q, kv = a.heads * a.hd, a.kv_heads * a.hd
    return {"q_proj": (a.hidden, q), "k_proj": (a.hidden, kv), "v_proj": (a.hidden, kv), "o_proj": (q, a.hidden),
            "gate_proj": (a.hidden, a.intermediate), "up_proj": (a.hidden, a.intermediate),
            "down_proj": (a.intermediate, a.hidden)}


def lora_parameter_count(a: Arch, rank: int, targets: list[str]) -> int:
    shapes = _module_shapes(a)
    return a.layers * sum(rank * (i + o) for t, (i, o) in shapes.items() if t in targets)


def activation_bytes_per_token_layer(a: Arch, b: int, lora_rank: int = 0, targets: tuple[str, ...] = ()) -> int:
    q, kv = a.heads * a.hd, a.kv_heads * a.hd
    out = b * (2 * q + 2 * kv + 4 * a.intermediate) + 2 * (8 + b) * a.hidden
    if lora_rank:
        out += b * sum(lora_rank + (i if b < 4 else 0) for t, (i, _) in _module_shapes(a).items() if t in targets)
    return out


def kv_bytes_per_token(a: Arch, b: int = 2) -> int:
    return 2 * a.layers * a.kv_heads * a.hd * b


def vllm_batched_tokens(gpu_memory_gb: float) -> int:
    """vLLM's default ``max_num_batched_tokens`` for ``vllm.LLM`` on a GPU of this size (an A100 of 80 GB gets 8192:
    the plan, which knows no device name, counts the larger)."""
    return VLLM_BATCHED_TOKENS[gpu_memory_gb >= VLLM_LARGE_DEVICE_GIB]


def vllm_profiling_peak(a: Arch, gpu_memory_gb: float) -> int:
    """~1 GiB (sampler, buffers) + the MLP activations of the profiling run's batched tokens, bf16."""
    return GiB + vllm_batched_tokens(gpu_memory_gb) * (4 * a.intermediate + 4 * a.hidden) * 2


def sleep_level(config) -> int:
    """The level a colocated vLLM sleeps at during updates: 1 (base weights to pinned host RAM and back) when only
    the LoRA adapter is synced, 2 (weights discarded: a merged sync overwrites them all) otherwise."""
    return 1 if weight_sync_mode(config) == "adapter" else 2


def launched_server_note(config, cuda: bool) -> str:
    """What the vLLM server ctu launches (``engine.launch=true``) does through updates: beside the trainer
    (``engine.colocated``) on CUDA it sleeps at level 1 (``--enable-sleep-mode``, ``POST /sleep?level=1``: its bf16
    weights pinned in host RAM, its KV cache dropped); vLLM's CPU platform has no sleep mode, so there it stays
    awake, as it does with ``engine.colocated=false``."""
    fraction = f"--gpu-memory-utilization {config.engine.gpu_memory_utilization}"
    if not cuda:
        return ("engine.launch=true on CPU: vLLM's CPU backend has no sleep mode, so the server ctu starts stays "
                "awake through updates (its memory is not counted here)")
    if not engines_sleep(config):
        return f"engine.launch=true: the vLLM server ctu starts shares this GPU with {fraction} and stays awake through updates"
    return (f"engine.launch=true: the vLLM server ctu starts shares this GPU with {fraction} and sleeps at level 1 "
            "during updates (--enable-sleep-mode: its bf16 weights pinned in host RAM, its KV cache dropped); on a "
            "machine without CUDA it stays awake (vLLM's CPU backend has no sleep mode)")


def host_pinned(config, engines: int, parameters: int) -> int:
    """Pinned host RAM per trainer GPU while its ``engines`` colocated vLLM engines sleep: their bf16 weights at
    level 1, nothing at level 2 or when they do not sleep (``engine.colocated=false``, split placement)."""
    if config.engine.kind != "vllm" or not config.engine.colocated or not engines:
        return 0
    return engines * 2 * parameters if sleep_level(config) == 1 else 0


def sync_engine_state(config, sharded: bool) -> str:
    """What a vLLM engine on the trainer's GPU holds while the sync's transient is alive: ``"asleep"`` (CUDA graphs
    only: an adapter is written to host before the wake; Ray trainer ranks, ``sharded``, gather and pack before the
    engines load), ``"weights"`` (a merged stream in one process loads into the woken weights, KV cache asleep), or
    ``"awake"`` (an engine that does not sleep: ``engine.colocated=false``, split placement, the hf engine)."""
    if config.engine.kind != "vllm" or not engines_sleep(config):
        return "awake"
    if weight_sync_mode(config) == "adapter" or sharded:
        return "asleep"
    return "weights"


@dataclass(frozen=True)
class Unit:
    """One FSDP unit as :func:`ctu.distributed.fsdp.gathered_named_tensors` sees it: the bytes of its gathered full
    parameters, and the tensors it hands out in order, (elements, whether a LoRA delta is merged into it)."""

    gathered: int
    tensors: tuple[tuple[int, bool], ...]


def sync_units(a: Arch, b: int, lora_rank: int = 0, targets: tuple[str, ...] = ()) -> list[Unit]:
    """The decoder layers, then the root (embedding, lm_head when untied, final norm). LoRA: the base is gathered in
    the compute dtype (b) and the adapters in fp32; full fine-tuning gathers fp32 masters."""
    shapes = _module_shapes(a)
    root = a.vocab * a.hidden * (1 if a.tied else 2) + a.hidden
    layer = (parameter_count(a) - root) // a.layers
    projections = [(i * o, bool(lora_rank) and t in targets) for t, (i, o) in shapes.items()]
    rest = layer - sum(n for n, _ in projections)  # biases, q/k norms, the two RMSNorms
    lora = lora_parameter_count(a, lora_rank, list(targets)) // a.layers if lora_rank else 0
    per = b if lora_rank else 4
    layer_unit = Unit(per * layer + 4 * lora, (*projections, (rest, False)))
    heads = (a.vocab * a.hidden,) * (1 if a.tied else 2)
    return [layer_unit] * a.layers + [Unit(per * root, tuple((n, False) for n in (*heads, a.hidden)))]


def stream_peak(units: list[Unit], out_bytes: int) -> int:
    """Peak bytes on rank 0 (the others drop each gather at once) of the gathered stream: while unit k+1
    is gathered, unit k's gathered parameters (``params``), fp32 deltas and handed-out tensors (``out``) are still
    referenced; a delta is made as B @ A and its scaled copy (8 bytes an element); a merge as an fp32 copy of the
    base plus the fp32 sum (8), then cast to ``out_bytes``; an unmerged tensor is cast or cloned (``out_bytes``)."""
    peak, previous_held, previous_out = 0, 0, 0
    for unit in units:
        peak = max(peak, previous_held + unit.gathered)
        deltas = 0
        for n, merged in unit.tensors:
            if merged:
                peak = max(peak, unit.gathered + previous_out + deltas + 8 * n)
                deltas += 4 * n
        out = 0
        for n, merged in unit.tensors:
            peak = max(peak, unit.gathered + deltas + out + (8 * n if merged else out_bytes * n))
            out += out_bytes * n
        previous_held, previous_out = unit.gathered + deltas + out, out
    return peak


def sync_transient(a: Arch, config, b: int, n: int, trainable: int) -> tuple[str, int]:
    """(label, bytes) a weight sync allocates on the trainer's GPU while the engine is awake (0: the in-process hf
    engine shares the policy's weights). One process (:func:`ctu.train.weights.merged_named_tensors`): one LoRA
    module's merge (fp32 base copy + fp32 delta + the result in the compute dtype) or one weight's cast. N > 1 ranks:
    :func:`stream_peak` of the gathered stream. The adapter goes out whole, fp32."""
    if config.engine.kind != "vllm" and not config.distributed.rollout_workers:
        return "", 0
    if weight_sync_mode(config) == "adapter":
        return "weight sync (LoRA adapter, fp32)", 4 * trainable
    lora = config.lora.enabled
    if n > 1:
        units = sync_units(a, b, config.lora.rank if lora else 0, tuple(config.lora.target_modules))
        what = "bf16 units, fp32 deltas, clones" if lora else "fp32 units and casts"
        return f"weight sync ({what})", stream_peak(units, b)
    if lora:
        largest = max(i * o for t, (i, o) in _module_shapes(a).items() if t in config.lora.target_modules)
        return "weight sync (one LoRA module's merge)", (8 + b) * largest
    return "weight sync (one weight's cast)", b * a.vocab * a.hidden


def export_transient(a: Arch, config, b: int, n: int, trainable: int) -> tuple[str, int]:
    """(label, bytes) the export (``trainer.export``) allocates on each GPU: one process
    (:func:`ctu.train.weights.export`, fp32, each tensor moved to host as it comes): a LoRA module's merge (an fp32
    copy of the base, the fp32 delta; the fp32 result is that copy) or an unmerged weight's fp32 cast (the largest:
    the embedding; fp32 masters go out as they are). N > 1 ranks (``TrainerRank.export``): :func:`stream_peak` of
    the gathered stream in fp32, plus the fp32 adapter rank 0 gathers first and keeps until it is written."""
    if not config.trainer.export:
        return "", 0
    lora = config.lora.enabled
    shapes = _module_shapes(a)
    if n > 1:
        units = sync_units(a, b, config.lora.rank if lora else 0, tuple(config.lora.target_modules))
        what = "bf16 units, fp32 deltas and results, fp32 adapter" if lora else "fp32 units and clones"
        return f"export ({what})", stream_peak(units, 4) + (4 * trainable if lora else 0)
    if not lora:
        return "", 0
    merge = 8 * max(i * o for t, (i, o) in shapes.items() if t in config.lora.target_modules)
    unmerged = [a.vocab * a.hidden] + [i * o for t, (i, o) in shapes.items() if t not in config.lora.target_modules]
    return "export (one fp32 merge or cast)", max(merge, (4 if b < 4 else 0) * max(unmerged))


def export_host_bytes(a: Arch, config) -> int:
    """Host RAM rank 0 (or the one process) holds to write the export: the fp32 model it loads and fills
    (``export_tensors``: ``from_pretrained(dtype=float32)``) and the host copy of the tensor being copied in (the
    largest: the embedding; safetensors writes from the tensors' own memory)."""
    if not config.trainer.export:
        return 0
    largest = max([a.vocab * a.hidden] + [i * o for i, o in _module_shapes(a).values()])
    return 4 * parameter_count(a) + 4 * largest
