"""A per-GPU memory plan for ``ctu train``: what each part needs, and whether it fits (before loading anything).

Shapes come from the model's ``config.json`` when the path is a local directory (or in the local HF cache),
else from :data:`ARCHITECTURES` (the presets' models and the built-ins); nothing is downloaded or loaded.
``P`` = parameters, ``N`` = GPUs, ``b`` = bytes of the compute dtype (bf16 on CUDA: 2), ``T`` = tokens of the
largest micro-batch = max(trainer.micro_batch_tokens, env.max_context_tokens) (a longer episode gets a
micro-batch of its own). Per GPU (FSDP2 FULL_SHARD divides the first four by N):

- weights: full fine-tuning keeps fp32 masters (4P) and always a frozen reference copy in the compute dtype
  (bP, built by ``build_policy`` whatever ``kl_coef``); LoRA keeps the base in the compute dtype (bP) and fp32
  adapters (4P_lora); the LoRA reference is the same model with adapters disabled (no copy).
- gradients fp32 (4 x trainable); AdamW state fp32 (8 x trainable); the optimizer step adds a temporary of
  4 x trainable on CUDA (foreach AdamW's sqrt(exp_avg_sq) copy; on CPU the for-loop adds its largest tensor).
- activations, per token and decoder layer, adapted from Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models" (sbh(34 + 5as/h) for GPT) to Llama/Qwen: SDPA/flash attention
  (no s^2 scores), no dropout, SwiGLU and GQA:
      A = b (2q + 2kv + 4i) + 2 (8 + b) h [+ LoRA: b * sum over adapted modules (r + in_features if b < 4)]
  (q = heads*head_dim, kv = kv_heads*head_dim, i = intermediate: rotated q/k, v, attention output; gate,
  silu(gate), up, their product; two RMSNorms with fp32 internals; peft's autocast copy of each adapter
  input). Without checkpointing: (L + 1) A T (the +1: one layer's activation gradients in backward). With
  checkpointing only each layer's input is kept (r_bytes h per layer; r_bytes = 4 in full fine-tuning, whose
  fp32 embedding makes the residual stream fp32) plus one layer recomputed and its gradients: (L r h + 2A) T.
  Both add (r + 8 + 2b) h T for the embedding output, final norm and gathered hidden states.
- logit chunk: C = min(trainer.logit_chunk_mib / 4 bytes, T V) fp32 elements (ctu.train.logprobs), held 6 times in the chunk's
  backward (its recompute saves logits, log_softmax, exp and the entropy product, or a single chunk keeps its
  log_softmax and exp from the forward; two gradients in flight) plus
  the lm_head output in the compute dtype, plus (full fine-tuning) one lm_head weight gradient V h 4 computed
  per chunk before it is accumulated.
- FSDP2 (N > 1): the root's unsharded embedding/lm_head (kept for the whole forward) and two gathered layers
  (one prefetched), in the compute dtype.
- vLLM (engine.kind=vllm, one engine per GPU, no tensor parallelism): gpu_memory_utilization x GPU memory,
  holding its bf16 weights (2P), its profiling peak (~1 GiB + vLLM's default batched tokens of MLP activations:
  16384 on a GPU of >= 70 GiB, 8192 below) and the KV cache (the rest, which must hold one
  env.max_context_tokens sequence); outside the fraction its CUDA graphs (VLLM_CUDA_GRAPHS, kept while asleep)
  and, for a Ray rollout worker, its process's CUDA context (CUDA_CONTEXT, every phase). Colocated engines sleep
  during updates (:func:`ctu.app.plan_terms.sleep_level`: level 1 for adapter syncs, pinning their bf16 weights in
  host RAM, shown as ``host_pinned``; level 2 for merged syncs, nothing pinned), so their fraction counts during
  rollouts only (a server ctu launches beside the trainer, too: level 1 on CUDA, awake on CPU); a non-colocated
  engine stays awake on the same GPU (``engine.colocated=false`` in one process),
  so its fraction counts in both phases. Split placement: engines on GPUs of their own, awake, no sleep or wake
  costs; each such GPU must hold fraction + graphs + context.
- hf engine: rollouts run on the policy itself; its KV cache is bounded by max_batch_size x max_context_tokens.
- overhead: the trainer's CUDA context (CUDA_CONTEXT) + 5% of the trainer's allocations for fragmentation.

- weight sync (:func:`sync_transient`): the merged stream's one LoRA module merge (fp32 base copy + fp32 delta +
  compute-dtype result) or one weight's cast; a sharded policy's gathered stream (:func:`ctu.app.plan_terms.stream_peak`:
  one unit gathered while the previous unit's gathered weights, fp32 deltas and handed-out clones are still
  referenced; at 8B LoRA the root unit and its bf16 clone), or the fp32 adapter (engine.weight_sync=adapter, whose
  vLLM also keeps bf16 LoRA slots out of its fraction: one adapter's in process, ``engine.max_loras`` or k + 1 in
  a server ctu launches). Beside it a sleeping vLLM holds
  (:func:`ctu.app.plan_terms.sync_engine_state`) its weights and graphs (a merged sync in one process: weights woken,
  loaded, then the KV cache woken), or its graphs only (an adapter written to host before the wake; Ray ranks'
  gather, packed before any engine loads); an engine that does not sleep is awake. The trainer empties its CUDA
  cache before vLLM starts or wakes, so nothing it freed counts.
- export (:func:`ctu.app.plan_terms.export_transient`, ``trainer.export``): after the final evaluation, engine awake: one
  fp32 merge or cast in one process, the gathered fp32 stream (and rank 0's fp32 adapter) over N ranks; rank 0
  fills one fp32 model in host RAM (:func:`ctu.app.plan_terms.export_host_bytes`, shown as ``host_export``).
- autocast (one process, compute dtype below fp32, no cast cache: :mod:`ctu.engines.cpu.precision`): casts of the
  fp32 weights live as long as their use; without checkpointing backward saves them all (b x trainable), with
  it one at a time (the largest: lm_head, b V h).

- layout (:func:`layout`): N = ``distributed.trainer_workers`` when set, else ``--gpus`` (``ctu train`` in one
  process plans one GPU); Ray rollout workers add their engines to the trainer GPU they share (``colocated``: k
  per GPU count k times; an hf worker holds its own bP copy) or take GPUs of their own (``split``).

Peak = max(training, rollout, weight sync, export phase); training = persistent (weights, reference, optimizer
state) + gradients + max(activations + logit chunk + FSDP buffers, optimizer-step temporary) + vLLM (asleep or awake);
rollout = persistent + engine (gradients are set to None right after the optimizer step); weight sync = persistent +
the engine as the sync finds it + its transient; export = rollout + its transient.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

from ctu.app.plan_terms import (  # noqa: F401 - re-exported: the shapes and terms live in ctu.app.plan_terms
    ARCHITECTURES,
    CUDA_CONTEXT,
    VLLM_CUDA_GRAPHS,
    Arch,
    GiB,
    _module_shapes,
    activation_bytes_per_token_layer,
    arch_from_config,
    export_host_bytes,
    export_transient,
    host_pinned,
    kv_bytes_per_token,
    launched_server_note,
    lora_parameter_count,
    parameter_count,
    resolve_arch,
    sleep_level,
    sync_engine_state,
    sync_transient,
    vllm_batched_tokens,
    vllm_profiling_peak,
)
from ctu.config.derived import served_max_loras
from ctu.config.schema import engines_sleep, weight_sync_mode

LOGIT_BUDGET = 1 << 25  # = ctu.train.logprobs.LOGIT_BUDGET (checked by a unit test; not imported: no torch here)
FRAGMENTATION = 0.05


@dataclass
class Plan:
    """Bytes per GPU for each part; ``fits`` when the peak phase is within ``gpu_memory``."""

    model: str
    gpus: int
    gpu_memory: int
    parameters: int
    trainable: int
    parts: dict[str, int] = field(default_factory=dict)  # component -> bytes per GPU
    activations_other: tuple[str, int] = ("", 0)  # the activations under the other checkpointing setting
    train_total: int = 0
    rollout_total: int = 0
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what does not fit, and by how much
    sync_total: int = 0  # the weight sync: rollout-phase memory (engine awake) + the sync's transient
    host_pinned: int = 0  # host (CPU) RAM pinned per GPU while its vLLM engines sleep at level 1
    export_total: int = 0  # the export at the end of a run: rollout-phase memory (engine awake) + its transient
    host_export: int = 0  # host (CPU) RAM rank 0 holds to write the fp32 export

    @property
    def total(self) -> int:
        return max(self.train_total, self.rollout_total, self.sync_total, self.export_total)

    @property
    def fits(self) -> bool:
        return not self.problems

    def render(self) -> str:
        gib = lambda n: f"{n / GiB:9.2f} GiB"  # noqa: E731
        lines = [f"memory plan: {self.model}  ({self.parameters / 1e9:.3f} B parameters, "
                 f"{self.trainable / 1e6:.1f} M trainable)  on {self.gpus} x {self.gpu_memory / GiB:.0f} GiB",
                 f"{'per GPU':<46}{'':>13}"]
        lines += [f"  {name:<44}{gib(value)}" for name, value in self.parts.items()]
        other, value = self.activations_other
        lines.append(f"  ({other:<42}{gib(value)})")
        lines += [f"{'training phase (peak)':<46}{gib(self.train_total)}",
                  f"{'rollout phase (peak)':<46}{gib(self.rollout_total)}",
                  f"{'weight sync phase (peak)':<46}{gib(self.sync_total)}",
                  f"{'export phase (peak)':<46}{gib(self.export_total)}",
                  f"{'GPU memory':<46}{gib(self.gpu_memory)}",
                  f"{'host (CPU) pinned RAM per GPU (vLLM asleep)':<46}{gib(self.host_pinned)}",
                  f"{'host (CPU) RAM for the export (rank 0)':<46}{gib(self.host_export)}"]
        lines += [f"note: {n}" for n in self.notes]
        lines.append("fits" if self.fits else "DOES NOT FIT: " + "; ".join(self.problems))
        return "\n".join(lines)


@dataclass(frozen=True)
class Layout:
    """Where a run's processes go: ``ranks`` FSDP2 trainer ranks (one GPU each), ``engines`` rollout engines
    sharing each trainer GPU, ``own_copy`` whether an hf engine holds its own model (a Ray worker) rather than
    using the policy's, ``engine_gpus`` GPUs holding only an engine (split placement), ``needed`` GPUs in all."""

    ranks: int
    engines: int
    own_copy: bool
    engine_gpus: int
    needed: int


def layout(config, gpus: int | None = None) -> Layout:
    """The GPUs ``config`` uses. ``distributed.trainer_workers=0`` trains in this process on one GPU; ``ctu plan
    --gpus N`` then shows FSDP2 over N ranks (what ``distributed.trainer_workers=N`` does). Ray rollout workers
    share trainer rank k % N's GPU (``colocated``) or get a GPU each (``split``); without trainer ranks they
    have no GPU placement (CPU)."""
    d = getattr(config, "distributed", None)
    tw, rw = (d.trainer_workers, d.rollout_workers) if d is not None else (0, 0)
    if not tw:
        ranks = gpus or 1
        return Layout(ranks, 0 if rw else 1, False, 0, ranks)
    if not rw:
        return Layout(tw, 1, False, 0, tw)
    if d.placement == "split":  # type: ignore[union-attr]  # tw > 0: a distributed section
        return Layout(tw, 0, True, rw, tw + rw)
    return Layout(tw, -(-rw // tw), True, 0, tw)


def plan(config, gpus: int | None = None, gpu_memory_gb: float = 80.0, device: str = "cuda") -> Plan:
    """The memory plan of ``config`` on ``gpus`` GPUs of ``gpu_memory_gb`` GiB each (None: the GPUs its
    :func:`layout` needs; ``device="cpu"``: one process's RAM, no CUDA context and no vLLM, for comparison with
    measured CPU peaks)."""
    where = layout(config, gpus)
    gpus = where.needed if gpus is None else gpus
    if gpus < 1:
        raise ValueError(f"need gpus >= 1, got {gpus}")
    if not math.isfinite(gpu_memory_gb) or gpu_memory_gb <= 0:  # nan compares false with everything
        raise ValueError(f"gpu memory must be a finite number of GiB > 0, got {gpu_memory_gb}")
    a = resolve_arch(config.model.path)
    cuda = device != "cpu"
    dtype = config.model.dtype
    b = {"float32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 2 if cuda else 4)
    n, memory = where.ranks, int(gpu_memory_gb * GiB)
    p = parameter_count(a)
    lora = config.lora.enabled
    targets = tuple(config.lora.target_modules)
    t = config.trainer
    trainable = lora_parameter_count(a, config.lora.rank, list(targets)) if lora else p
    parts: dict[str, int] = {}
    if lora:
        parts["weights (base, compute dtype)"] = b * p // n
        parts["weights (LoRA adapters, fp32)"] = 4 * trainable // n
    else:
        parts["weights (fp32 masters)"] = 4 * p // n
        parts["reference (frozen copy)"] = b * p // n
    parts["gradients (fp32)"] = 4 * trainable // n
    parts["optimizer state (AdamW, fp32)"] = 8 * trainable // n
    persistent = sum(parts.values()) - parts["gradients (fp32)"]
    tokens = max(t.micro_batch_tokens, config.env.max_context_tokens)
    layer = activation_bytes_per_token_layer(a, b, config.lora.rank if lora else 0, targets)
    residual = b if lora else 4
    edges = (residual + 8 + 2 * b) * a.hidden * tokens
    act_ckpt = (a.layers * residual * a.hidden + 2 * layer) * tokens + edges
    act_full = (a.layers + 1) * layer * tokens + edges
    name = f"activations ({tokens} tokens, {{}})"
    if t.gradient_checkpointing:
        parts[name.format("checkpointed")] = act_ckpt
        other = (name.format("without checkpointing"), act_full)
    else:
        parts[name.format("no checkpointing")] = act_full
        other = (name.format("with checkpointing"), act_ckpt)
    chunk = min(t.logit_chunk_mib * 2**20 // 4, tokens * a.vocab)  # trainer.logit_chunk_mib, in fp32 elements
    parts["logit chunk"] = chunk * (24 + (b if b < 4 else 0)) + (0 if lora else 4 * a.vocab * a.hidden)
    if n > 1:
        root = a.vocab * a.hidden * (1 if a.tied else 2)
        parts["FSDP2 gather buffers"] = b * (root + 2 * (p - root) // a.layers)
    if n == 1 and b < 4:  # autocast casts of fp32 weights (no cast cache): saved for backward, or one at a time
        casts = b * (a.vocab * a.hidden if not lora else trainable // a.layers)
        parts["autocast casts (compute dtype)"] = casts if t.gradient_checkpointing else b * trainable
    step_temp = 4 * trainable // n if cuda else 4 * (a.vocab * a.hidden if not lora else trainable // a.layers)
    forward = parts[next(k for k in parts if k.startswith("activations"))] + parts["logit chunk"]
    forward += parts.get("FSDP2 gather buffers", 0) + parts.get("autocast casts (compute dtype)", 0)
    notes, problems = [], []
    if where.needed > gpus:
        problems.append(f"distributed: {where.ranks} trainer ranks + {where.engine_gpus} split rollout workers need "
                        f"{where.needed} GPUs, {gpus} given")
    train = persistent + parts["gradients (fp32)"] + max(forward, step_temp)
    rollout = persistent  # gradients are freed (set to None) right after the optimizer step
    kind, k = config.engine.kind, where.engines
    served = kind == "served" and bool(getattr(config.engine, "launch", False))  # a server ctu starts on this GPU
    served_sleeps = served and cuda and engines_sleep(config)  # level 1 through updates (no sleep mode on CPU)
    if served:  # vLLM beside the trainer, its fraction as launched
        kind = "vllm"
        notes.append(launched_server_note(config, cuda))
    elif kind == "served":
        notes.append("engine.base_url: the served engine's server runs elsewhere (not counted here)")
    if where.engines > 1:
        notes.append(f"{k} rollout workers share each trainer GPU: their engines count {k} times")
    if kind == "vllm" and cuda:
        fraction = int(config.engine.gpu_memory_utilization * memory)
        parts["vLLM weights (bf16)"] = 2 * p
        parts["vLLM profiling peak"] = vllm_profiling_peak(a, gpu_memory_gb)
        if lora and weight_sync_mode(config) == "adapter":  # enable_lora: max_loras adapters' slots
            # in process vLLM's default max_loras=1; a launched server --max-loras served_max_loras (k + 1)
            parts["vLLM LoRA slots (bf16)"] = 2 * trainable * (served_max_loras(config) if served else 1)
        kv = fraction - parts["vLLM weights (bf16)"] - parts["vLLM profiling peak"]
        kv -= parts.get("vLLM LoRA slots (bf16)", 0)
        parts["vLLM KV cache"] = max(0, kv)
        need_kv = kv_bytes_per_token(a) * config.env.max_context_tokens
        if kv < need_kv:
            problems.append(f"vLLM KV cache: {max(0, kv) / GiB:.2f} GiB left of gpu_memory_utilization="
                            f"{config.engine.gpu_memory_utilization} x {gpu_memory_gb:g} GiB, one "
                            f"{config.env.max_context_tokens}-token sequence needs {need_kv / GiB:.2f} GiB "
                            f"(short by {(need_kv - max(0, kv)) / GiB:.2f} GiB)")
        else:
            notes.append(f"vLLM KV cache holds {kv // kv_bytes_per_token(a)} tokens "
                         f"({kv // need_kv} sequences of {config.env.max_context_tokens})")
        notes.append(f"vLLM batches {vllm_batched_tokens(gpu_memory_gb)} tokens (its default for a "
                     f"{gpu_memory_gb:g} GiB GPU) in the profiling run that sizes its KV cache")
        if where.engine_gpus:
            engine_gpu = fraction + VLLM_CUDA_GRAPHS + CUDA_CONTEXT
            notes.append(f"split placement: vLLM stays awake on each of {where.engine_gpus} rollout GPUs (no sleep or "
                         f"wake, nothing pinned on the host): {engine_gpu / GiB:.1f} GiB of {gpu_memory_gb:g} (its "
                         "fraction, CUDA graphs, its process's CUDA context); the trainer GPUs hold no engine")
            if engine_gpu > memory:
                problems.append(f"split rollout GPU needs {engine_gpu / GiB:.1f} GiB (gpu_memory_utilization="
                                f"{config.engine.gpu_memory_utilization} + CUDA graphs + context), "
                                f"{gpu_memory_gb:g} GiB given")
        if k:
            parts["vLLM CUDA graphs (outside fraction, asleep)"] = k * VLLM_CUDA_GRAPHS
        rollout += k * (fraction + VLLM_CUDA_GRAPHS)
        if served_sleeps:
            train += k * VLLM_CUDA_GRAPHS
        elif config.engine.colocated and k and not served:
            train += k * VLLM_CUDA_GRAPHS
            level = sleep_level(config)
            notes.append(f"vLLM sleep level {level} during updates: " + (
                "its bf16 weights go to pinned host RAM and back (an adapter sync keeps the base)" if level == 1 else
                "weights discarded (the merged sync rewrites them all), nothing pinned on the host"))
        elif k:
            train += k * fraction + k * VLLM_CUDA_GRAPHS
            if not served:
                notes.append("engine.colocated=false: vLLM stays awake on this GPU during updates")
    elif kind == "hf":
        parts["hf engine KV cache (bound)"] = (kv_bytes_per_token(a, b) * config.engine.max_batch_size
                                               * config.env.max_context_tokens)
        if where.own_copy:  # a Ray rollout worker loads its own copy of the model in the compute dtype
            parts["hf rollout worker's model copy"] = b * p
            engine = parts["hf engine KV cache (bound)"] + parts["hf rollout worker's model copy"]
            if where.engine_gpus and engine + CUDA_CONTEXT > memory:
                problems.append(f"split rollout worker needs {(engine + CUDA_CONTEXT) / GiB:.1f} GiB per GPU, "
                                f"{gpu_memory_gb:g} GiB given")
        rollout += k * (parts["hf engine KV cache (bound)"] + parts.get("hf rollout worker's model copy", 0))
        if getattr(config.engine, "kv_reuse", False):
            parts["hf engine KV kept across turns (engine.kv_cache_tokens)"] = (kv_bytes_per_token(a, b)
                                                                                * config.engine.kv_cache_tokens)
            rollout += parts["hf engine KV kept across turns (engine.kv_cache_tokens)"]
    staleness = int(getattr(t, "max_staleness", 0) or 0)
    if staleness and kind == "hf" and not where.own_copy:  # asynchronous RL: the producer's engine in this process
        parts["async: the producer's model copy (compute dtype)"] = b * p  # the optimizer must not move its weights
        generating = b * p + parts["hf engine KV cache (bound)"]
        generating += parts.get("hf engine KV kept across turns (engine.kv_cache_tokens)", 0)
        rollout += b * p
        train += generating  # the producer keeps generating through the update
        notes.append(f"trainer.max_staleness={staleness}: the producer's engine holds a merged copy of the policy "
                     "and generates through the update: its copy and KV caches count in every phase")
    label, transient = sync_transient(a, config, b, n, trainable)
    if transient:
        parts[label] = transient
    sharded = n > 1 or bool(getattr(getattr(config, "distributed", None), "trainer_workers", 0))
    state = "asleep" if served_sleeps else sync_engine_state(config, sharded)  # served: written to disk, then woken
    engine = rollout - persistent  # what the engines hold awake
    if state != "awake" and kind == "vllm" and cuda:
        engine = k * (VLLM_CUDA_GRAPHS + (0 if state == "asleep" else 2 * p + parts.get("vLLM LoRA slots (bf16)", 0)))
        notes.append("weight sync: vLLM holds " + ("its weights and CUDA graphs, KV cache asleep, while the stream "
                     "loads" if state == "weights" else "only its CUDA graphs while the weights are gathered or "
                     "written to host"))
    sync = persistent + engine + transient
    label, exporting = export_transient(a, config, b, n, trainable)
    if exporting:
        parts[label] = exporting
    export = rollout + exporting if config.trainer.export else 0  # after the final evaluation: the engine awake
    if kind == "vllm" and cuda:
        notes.append("the trainer empties its CUDA cache (torch.cuda.empty_cache) before vLLM starts or wakes: "
                     "what the trainer freed is not counted beside vLLM's fraction")
    if cuda and k and where.own_copy:  # Ray rollout workers: processes of their own beside the trainer rank
        parts["rollout workers' CUDA context"] = k * CUDA_CONTEXT
    context = (CUDA_CONTEXT if cuda else 0) + parts.get("rollout workers' CUDA context", 0)
    train, rollout, sync = (int(x * (1 + FRAGMENTATION)) + context for x in (train, rollout, sync))
    export = int(export * (1 + FRAGMENTATION)) + context if export else 0
    parts["overhead (context, fragmentation)"] = context + int(FRAGMENTATION * max(train, rollout, sync, export)
                                                               / (1 + FRAGMENTATION))
    for phase, total in (("training", train), ("rollout", rollout), ("weight sync", sync), ("export", export)):
        if total > memory:
            problems.insert(0, f"{phase} phase needs {total / GiB:.1f} GiB per GPU, {gpus} x {gpu_memory_gb:g} "
                               f"GiB has {memory / GiB:.1f} (short by {(total - memory) / GiB:.1f} GiB)")
    if n > 1 and not getattr(getattr(config, "distributed", None), "trainer_workers", 0):
        notes.append(f"{n} GPUs assume FSDP2 FULL_SHARD over {n} trainer ranks: `ctu train` needs "
                     f"distributed.trainer_workers={n} for that (without it, it trains on one GPU)")
    pinned = (k * 2 * p if served_sleeps else 0 if served else host_pinned(config, k, p)) if kind == "vllm" and cuda else 0
    return Plan(config.model.path, gpus, memory, p, trainable, parts, other, train, rollout, notes, problems, sync,
                pinned, export, export_host_bytes(a, config))


def check_fits(config, gpus: int | None = None, gpu_memory_gb: float = 80.0) -> Plan:
    """The plan, or a one-line ValueError naming what does not fit and by how much. ``gpus`` None: the GPUs the
    run uses (:func:`layout`: one in process, whatever the machine has, or the Ray trainer ranks' own)."""
    result = plan(config, gpus, gpu_memory_gb)
    if not result.fits:
        hint = ("; on N GPUs set distributed.trainer_workers=N distributed.rollout_workers=N"
                if not config.distributed.trainer_workers else "")
        raise ValueError(f"memory plan: {config.model.path} does not fit on {result.gpus} x {gpu_memory_gb:g} GiB: "
                         + "; ".join(result.problems) + f" (see `ctu plan`{hint})")
    return result


def cuda_hardware() -> tuple[int, float] | None:
    """(visible GPUs, GiB of the smallest) when CUDA is available, else None. ``ctu train`` checks the GiB only:
    the GPUs a run uses are its :func:`layout`'s, not the machine's."""
    import torch

    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    return count, min(torch.cuda.get_device_properties(i).total_memory for i in range(count)) / GiB


def main(argv=None) -> int:
    """``ctu plan CONFIG [k=v ...] [--gpus N] [--gpu-memory GB]``: print the plan; 0 if it fits, else 1."""
    from ctu.config.schema import load_config

    parser = argparse.ArgumentParser(prog="ctu plan", description="Per-GPU memory plan of a training config.")
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU as torch reports it (default 80; an 80 GB H100/A100 has ~79.2, a 141 GB H200 ~139.8)")
    args = parser.parse_args(argv)
    result = plan(load_config(args.config, args.overrides), args.gpus, args.gpu_memory)
    print(result.render())
    return 0 if result.fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
