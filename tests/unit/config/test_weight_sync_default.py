"""engine.weight_sync defaults to the adapter for LoRA runs on vLLM (no merged copy of the model built on the GPU
per sync); merged stays available, and is what full fine-tuning, the hf engine and Ray rollout workers use."""

from pathlib import Path

import pytest

from ctu.config.schema import ConfigError, load_config, weight_sync_mode


@pytest.mark.parametrize(("overrides", "mode"), [
    (["engine.kind=vllm"], "adapter"),  # LoRA is on by default
    (["engine.kind=vllm", "lora.enabled=false"], "merged"),
    (["engine.kind=hf"], "merged"),
    (["engine.kind=vllm", "engine.weight_sync=merged"], "merged"),
    (["engine.kind=vllm", "engine.weight_sync=adapter"], "adapter"),
    (["engine.kind=hf", "distributed.rollout_workers=2"], "merged"),
])
def test_weight_sync_default(overrides, mode):
    config = load_config(None, overrides)
    assert config.engine.weight_sync == "auto" or "engine.weight_sync" in " ".join(overrides)
    assert weight_sync_mode(config) == mode


def test_an_explicit_adapter_sync_still_needs_vllm_and_lora():
    with pytest.raises(ConfigError, match="engine.weight_sync"):
        load_config(None, ["engine.kind=hf", "engine.weight_sync=adapter"])


@pytest.mark.parametrize("preset", sorted(p.name for p in Path("configs").glob("*lora*.yaml")))
def test_the_lora_presets_sync_the_adapter(preset):
    assert weight_sync_mode(load_config(f"configs/{preset}")) == "adapter"


def test_the_vllm_engine_of_a_default_lora_run_takes_adapters(monkeypatch):
    from ctu.rollout.components import build_engine

    seen = {}
    monkeypatch.setattr("ctu.engines.registry.make_engine", lambda kind, **kw: seen.update(kind=kind, **kw))
    build_engine(load_config(None, ["engine.kind=vllm"]))
    assert seen["kind"] == "vllm" and seen["enable_lora"] is True
