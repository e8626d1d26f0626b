"""What a config implies beyond its values: whether rollout engines sleep through trainer work, and what a weight
sync sends. Pure functions of a :class:`~ctu.config.schema.Config` (its checks use them too)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # annotations only: ctu.config.schema imports this module
    from ctu.config.schema import Config


def engines_sleep(config: Config) -> bool:
    """Whether the rollout engines sleep through trainer work: only where they share the trainer's GPU
    (``engine.colocated``). Ray rollout workers placed apart from the trainer ranks (``distributed.placement=split``)
    have GPUs of their own and stay awake: sleeping there would only move their weights to host RAM and back."""
    d = config.distributed
    split = d.placement == "split" and d.rollout_workers > 0 and d.trainer_workers > 0
    return config.engine.colocated and not split


def weight_sync_mode(config: Config) -> Literal["merged", "adapter"]:
    """What a weight sync sends: ``engine.weight_sync``, or for ``auto`` the LoRA adapter when a LoRA run syncs
    an in-process vLLM engine (no merged copy of the model per sync), merged weights otherwise."""
    mode = config.engine.weight_sync
    if mode != "auto":
        return mode
    adapter = config.engine.kind == "vllm" and config.lora.enabled and not config.distributed.rollout_workers
    return "adapter" if adapter else "merged"
