"""Shared by the ctu.app.plan tests (tests/unit/test_plan_*.py): the presets they plan and how they read a plan's parts."""

from pathlib import Path

from ctu.app.plan import CUDA_CONTEXT, FRAGMENTATION

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
QWEN3_8B = str(CONFIGS / "qwen3-8b-lora.yaml")
THREE_B = str(CONFIGS / "qwen2.5-3b-retail.yaml")
SEVEN_B = str(CONFIGS / "qwen2.5-7b-multidomain.yaml")
RAY8 = ["distributed.trainer_workers=8", "distributed.rollout_workers=8"]


def part(result, prefix):
    """The one part of ``result`` whose name starts with ``prefix``."""
    hits = [v for k, v in result.parts.items() if k.startswith(prefix)]
    assert len(hits) == 1, (prefix, list(result.parts))
    return hits[0]


def overhead(raw, contexts=1):
    """``raw`` bytes as the plan counts them on a GPU: fragmentation plus ``contexts`` CUDA contexts."""
    return int(raw * (1 + FRAGMENTATION)) + contexts * CUDA_CONTEXT
