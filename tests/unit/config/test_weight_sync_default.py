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
    (["engine.kind=vllm", "distributed.rollout_workers=1", "distributed.trainer_workers=1"], "merged"),
    (["engine.kind=served", "engine.launch=true", "distributed.rollout_workers=2"], "adapter"),
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


def test_ray_workers_attached_to_one_server_are_refused_beyond_one():
    base = ["engine.kind=served", "engine.base_url=http://127.0.0.1:8000/v1"]
    assert load_config(None, [*base, "distributed.rollout_workers=1"])
    with pytest.raises(ConfigError, match="distributed.rollout_workers: 2 workers would each load every version "
                                          "into the one server at engine.base_url"):
        load_config(None, [*base, "distributed.rollout_workers=2"])
