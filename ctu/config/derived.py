"""What a config implies beyond its values: whether rollout engines sleep through trainer work, and what a weight
sync sends. Pure functions of a :class:`~ctu.config.schema.Config` (its checks use them too)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ctu.config.fields import Config


def engines_sleep(config: Config) -> bool:
    """Whether the rollout engines sleep through trainer work: only where they share the trainer's GPU
    (``engine.colocated``). Ray rollout workers placed apart from the trainer ranks (``distributed.placement=split``)
    have GPUs of their own and stay awake: sleeping there would only move their weights to host RAM and back."""
    d = config.distributed
    split = d.placement == "split" and d.rollout_workers > 0 and d.trainer_workers > 0
    return config.engine.colocated and not split


def weight_sync_mode(config: Config) -> Literal["merged", "adapter"]:
    """What a weight sync sends: ``engine.weight_sync``, or for ``auto`` the LoRA adapter when a LoRA run syncs
    a vLLM engine, in process or served, also from Ray rollout workers (no merged copy of the model per sync),
    merged weights otherwise (vLLM engines on Ray rollout workers take merged weights)."""
    mode = config.engine.weight_sync
    if mode != "auto":
        return mode
    kind, workers = config.engine.kind, config.distributed.rollout_workers
    adapter = config.lora.enabled and (kind == "served" or (kind == "vllm" and not workers))
    return "adapter" if adapter else "merged"


def max_staleness(config: Config) -> int:
    """How many versions old a trained-on sample may be (``trainer.max_staleness`` where the trainer has it)."""
    return int(getattr(config.trainer, "max_staleness", 0) or 0)


def served_max_loras(config: Config) -> int:
    """The adapters a served engine holds at once: ``engine.max_loras``, or every version a step may train on."""
    return config.engine.max_loras if config.engine.max_loras is not None else max_staleness(config) + 1
