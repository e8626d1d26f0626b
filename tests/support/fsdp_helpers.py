"""Shared by the FSDP tests (tests/unit/test_fsdp*.py, test_offload_device.py, tests/gpu/test_fsdp*_cuda.py):
process groups, spawned ranks, and the LoRA perturbation that keeps a policy off its reference."""

from __future__ import annotations

import os
import socket
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def single_process_group(backend: str, **init_kwargs):
    """A world-size-1 process group (rank 0) on a fresh local port, destroyed on exit."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group(backend, rank=0, world_size=1, **init_kwargs)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextmanager
def spawned_rank(rank: int, out: str | Path):
    """The body of a rank started by ``torch.multiprocessing``: a failure's traceback goes to ``out/error-{rank}.txt``
    (the parent reads it back) before it propagates, and the process group is destroyed either way."""
    import torch.distributed as dist

    try:
        yield
    except BaseException:
        (Path(out) / f"error-{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def perturb_lora_b(policy) -> None:
    """Seeded non-zero LoRA B weights (0 at init), so that the adapter changes the outputs."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_((torch.randn(p.shape, generator=g) * 0.05).to(p.device))
