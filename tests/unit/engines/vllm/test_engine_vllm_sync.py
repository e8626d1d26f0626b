"""vLLM weight sync against the fake (tests/fakes/fake_vllm.py): merged weights streamed through
``collective_rpc("reload_weights")``, adapter directories cleaned up, the CPU platform (no sleep mode), and
the ``max_lora_rank`` values vLLM accepts. The real thing on CPU: tests/vllm_cpu."""

import gc
import os
import weakref

import pytest
import torch

from ctu.config.schema import ConfigError, load_config
from tests.fakes import fake_vllm
from tests.unit.engines.vllm.test_engine_vllm import (
    PROMPT,
    assert_close,
    gen,
    make,
    peft_adapter,
    strong_update,
    teacher_forced,
)


def watched_stream(pairs, alive_limit=2):
    """Yield ``pairs`` (fresh tensors), failing if the consumer still holds more than ``alive_limit`` of them."""
    refs = []
    for name, tensor in pairs:
        gc.collect()
        alive = sum(r() is not None for r in refs)
        assert alive < alive_limit, f"{alive} tensors held before {name}: the update is not streamed"
        fresh = tensor.clone()
        refs.append(weakref.ref(fresh))
        yield name, fresh
        del fresh


@pytest.mark.parametrize("via", ["iterator", "path"])
def test_merged_weights_stream_into_reload_weights_and_reset_the_prefix_cache(monkeypatch, via):
    engine = make(monkeypatch, weights_via=via, shard_bytes=1)  # path: one tensor per safetensors shard
    model = engine.llm.hf
    gen(engine, [PROMPT], temperature=0.0, max_tokens=4)  # fills the prefix cache
    update = strong_update(model)
    engine.update_weights(watched_stream(update))
    params = dict(model.named_parameters())
    for name, tensor in update:
        torch.testing.assert_close(params[name].detach(), tensor.to(params[name].dtype), rtol=0, atol=0)
    hits = engine.llm.cache_hits
    (c,) = gen(engine, [PROMPT], temperature=0.0, max_tokens=4)[0]
    assert engine.llm.cache_hits == hits
    assert_close(c.logprobs, teacher_forced(model, PROMPT, c, 0.0))


def test_the_path_route_leaves_no_weight_files_behind(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    engine = make(monkeypatch, weights_via="path")
    engine.update_weights(strong_update(engine.llm.hf))
    assert os.listdir(tmp_path) == []


def test_a_peft_name_mid_stream_stops_the_update_with_a_clear_error(monkeypatch):
    engine = make(monkeypatch)
    good = strong_update(engine.llm.hf)[:1]
    with pytest.raises(ValueError, match="PEFT names such as .*lora_A"):
        engine.update_weights(good + [("base_model.model.model.layers.0.mlp.up_proj.lora_A.weight", torch.zeros(1))])


def test_the_iterator_route_needs_an_in_process_engine_core(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    engine = make(monkeypatch)
    assert engine.weights_via == "path"  # a generator cannot be pickled to the engine process
    with pytest.raises(TypeError, match="pickle"):
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(())})
    engine.update_weights(strong_update(engine.llm.hf))


def test_the_fake_refuses_load_weights_outside_reload_weights(monkeypatch):
    fake_vllm.install(monkeypatch)
    llm = fake_vllm.LLM("tiny-random")
    name, param = next(iter(llm.hf.named_parameters()))
    with pytest.raises(AssertionError, match=r"torch.Size\(\[0\]\)"):
        llm.apply_model(lambda model: model.load_weights([(name, param.detach())]))


def test_adapter_sync_deletes_the_previous_versions_directory(monkeypatch):
    engine = make(monkeypatch, enable_lora=True, max_lora_rank=8, lora_alpha=8)
    paths = []
    for version in range(3):
        tensors, config, _ = peft_adapter(engine.llm.hf, seed=version)
        engine.update_adapter(tensors, version=version, peft_config=config)
        gen(engine, [PROMPT], temperature=0.0, max_tokens=2)  # served: vLLM has read the directory
        paths.append(engine.lora_request.lora_path)
    assert [os.path.isdir(p) for p in paths] == [False, False, True]
    engine.close()
    assert not os.path.exists(paths[-1])


def test_adapter_sync_never_deletes_a_directory_it_was_given(monkeypatch, tmp_path):
    from tests.unit.engines.vllm.test_engine_vllm import write_adapter

    engine = make(monkeypatch, enable_lora=True, max_lora_rank=8, lora_alpha=8)
    tensors, config, _ = peft_adapter(engine.llm.hf, seed=0)
    given = write_adapter(tmp_path / "mine", tensors, config)
    engine.update_adapter(given, version=0)
    engine.update_adapter(tensors, version=1, peft_config=config)
    engine.update_adapter(tensors, version=2, peft_config=config)
    assert os.path.isdir(given)


def test_max_lora_rank_must_be_one_vllm_accepts(monkeypatch):
    with pytest.raises(ValueError, match="max_lora_rank must be one of"):
        make(monkeypatch, enable_lora=True, max_lora_rank=4)
    with pytest.raises(ValueError, match="max_lora_rank"):
        fake_vllm.LLM("tiny-random", enable_lora=True, max_lora_rank=4)
    make(monkeypatch, max_lora_rank=4)  # LoRA off: the rank is not vLLM's business


def test_lora_rank_outside_vllms_set_is_a_config_error_when_vllm_serves_the_adapter():
    with pytest.raises(ConfigError, match=r"^lora.rank: .*vLLM.*got 4") as info:
        load_config(None, ["engine.kind=vllm", "engine.weight_sync=adapter", "lora.rank=4"])
    assert "\n" not in str(info.value)
    load_config(None, ["engine.kind=vllm", "engine.weight_sync=merged", "lora.rank=4"])  # merged: no LoRA in vLLM
    load_config(None, ["engine.kind=hf", "lora.rank=4"])
    load_config(None, ["engine.kind=vllm", "engine.weight_sync=adapter", "lora.rank=64"])


def test_on_a_platform_without_sleep_mode_the_engine_neither_asks_for_it_nor_sleeps(monkeypatch):
    monkeypatch.setattr(fake_vllm, "SLEEP_MODE", False)  # vLLM's CPU backend
    engine = make(monkeypatch)
    assert "enable_sleep_mode" not in engine.llm.kwargs and not engine.sleep_mode
    engine.sleep()
    assert not engine.sleeping and engine.llm.sleep_level is None
    gen(engine, [PROMPT], temperature=0.0, max_tokens=2)  # still serving
    engine.wake_up()
    engine.update_weights(strong_update(engine.llm.hf))
    with pytest.raises(ValueError, match="enable_sleep_mode"):
        make(monkeypatch, enable_sleep_mode=True)


def test_the_engine_computes_in_the_trainers_dtype(monkeypatch):
    """On CPU the trainer computes in fp32 (model.dtype=auto): a bf16 engine drifted past the parity tolerance
    by the third adapter sync on real vLLM (0.148 > 0.1; fp32: 1e-6)."""
    from ctu.engines.vllm.engine import vllm_dtype
    from ctu.rollout.components import build_engine

    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert build_engine(load_config(None, ["engine.kind=vllm", "model.path=tiny-random"])).llm.kwargs["dtype"] == "float32"
    picked = load_config(None, ["engine.kind=vllm", "model.path=tiny-random", "model.dtype=bfloat16"])
    assert build_engine(picked).llm.kwargs["dtype"] == "bfloat16"
    assert vllm_dtype("auto", cuda=True) == "bfloat16" and vllm_dtype("float16", cuda=False) == "float16"
