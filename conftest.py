"""Repository-wide pytest setup: no network hub access, and hardware markers that skip cleanly."""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import settings

# Property tests are derandomized by default so CI is reproducible; HYPOTHESIS_PROFILE=explore draws new examples.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Nothing may download from a model hub at run time, in tests above all.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = _cuda_available()
    has_vllm = importlib.util.find_spec("vllm") is not None
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    skip_vllm = pytest.mark.skip(reason="needs vLLM (pip install 'ctu[vllm]') and a CUDA device")
    for item in items:
        if "vllm" in item.keywords and not (has_vllm and has_cuda):
            item.add_marker(skip_vllm)
        elif "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
