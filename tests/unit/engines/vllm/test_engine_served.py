"""The served engine against a fake vLLM server (tests/fakes/fake_vllm_server.py: vLLM 0.33's HTTP semantics, the
hf engine's exact tokens): LoRA versions hot-loaded with parity and a version stamp after each, stale loads caught,
merged reload through the dev routes, errors in one line without the API key."""

import logging

import httpx
import pytest
import torch

from ctu.engines.base import SamplingParams
from ctu.engines.checks.parity import ParityError, check_parity, check_versions, probe_parity
from ctu.engines.hf.models import load_model
from ctu.engines.vllm.served import ServedEngine, ServedEngineError
from ctu.train.logprobs import token_logprobs
from ctu.train.sync import adapter_named_tensors
from tests.fakes.fake_vllm_server import FakeVLLMServer

KEY = "sk-served-secret"


@pytest.fixture(scope="module")
def server():
    with FakeVLLMServer(api_key=KEY) as fake:
        yield fake


@pytest.fixture
def fake(server):
    server.adapters.clear()
    server.engines = {server.name: server.engines[server.name]}
    server.events.clear()
    server.keep_old_weights = server.forget_loads = server.fail_loads = False
    server.runtime_lora = server.dev_mode = True
    server.logprobs_mode = "processed_logprobs"
    return server


def engine_for(fake, tmp_path, monkeypatch, **kw):
    monkeypatch.setenv("SERVED_KEY", KEY)
    engine = ServedEngine(fake.url + "/v1", fake.name, weights_dir=str(tmp_path / "w"), keep=2, lora_alpha=16,
                          api_key_env="SERVED_KEY", max_retries=0, **kw)
    return engine


@pytest.fixture(scope="module")
def policy():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_model("tiny-random", dtype=torch.float32, device="cpu"),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    return model.eval()


def score_with(model):
    return lambda ids, attn, temperature: token_logprobs(model, ids, attn, temperature)[0]


def new_version(policy, seed: int) -> None:
    """Move the adapter's weights (lora_B starts at zero: the adapter would be a no-op)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def test_three_adapter_versions_hot_load_with_parity_and_version_after_each(fake, policy, tmp_path, monkeypatch):
    engine = engine_for(fake, tmp_path, monkeypatch)
    engine.connect("adapter", lora=True)
    for version in (1, 2, 3):
        new_version(policy, version)
        engine.update_adapter(adapter_named_tensors(policy), version)
        diff = probe_parity(engine, score_with(policy), temperature=0.7, tokens=8, seed=version)
        check_parity(diff, 1e-3)
        check_versions([engine.weights_version], version)
        assert set(fake.adapters) == {f"ctu-v{v}" for v in (version - 1, version) if v >= 1}  # the newest keep=2
        assert fake.requests[-1]["model"] == f"ctu-v{version}"
    assert [e for e in fake.events if not e.startswith("complete")] == [
        "load ctu-v1", "reset", "load ctu-v2", "reset", "load ctu-v3", "reset", "unload ctu-v1"]
    on_disk = sorted(p.name for p in (tmp_path / "w").iterdir())
    assert on_disk == [f"ctu-v2-{engine.tag}", f"ctu-v3-{engine.tag}"]  # keep=2 on disk
    engine.close()
    assert not any((tmp_path / "w").iterdir())


def test_completions_carry_the_server_token_ids_and_the_version_that_sampled_them(fake, policy, tmp_path, monkeypatch):
    engine = engine_for(fake, tmp_path, monkeypatch)
    engine.connect("adapter", lora=True)
    (before,) = engine.generate_sync([[5, 6, 7]], SamplingParams(max_tokens=4, seed=1))[0]
    assert before.version == 0 and list(before.token_ids) == fake.returned[-1]
    new_version(policy, 7)
    engine.update_adapter(adapter_named_tensors(policy), 4)
    outs = engine.generate_sync([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=4, n=2, seed=1))
    assert [c.version for row in outs for c in row] == [4] * 4
    body = fake.requests[-1]
    assert body["prompt"] in ([5, 6, 7], [8, 9]) and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    returned = fake.returned[-4:]
    assert sorted(list(c.token_ids) for row in outs for c in row) == sorted(returned)


@pytest.mark.parametrize("fault", ["fail_loads", "forget_loads", "keep_old_weights"])
def test_a_stale_adapter_is_caught(fake, policy, tmp_path, monkeypatch, fault):
    engine = engine_for(fake, tmp_path, monkeypatch)
    engine.connect("adapter", lora=True)
    new_version(policy, 1)
    engine.update_adapter(adapter_named_tensors(policy), 1)
    setattr(fake, fault, True)
    new_version(policy, 2)
    if fault == "fail_loads":
        with pytest.raises(ServedEngineError) as caught:
            engine.update_adapter(adapter_named_tensors(policy), 2)
        message = str(caught.value)
        assert fake.url in message and "ctu-v2" in message and "HTTP 500" in message and KEY not in message
        assert "\n" not in message and engine.weights_version == 1
        return
    engine.update_adapter(adapter_named_tensors(policy), 2)
    diff = probe_parity(engine, score_with(policy), temperature=1.0, tokens=8)
    with pytest.raises(ParityError):
        check_versions([engine.weights_version], 2)
        check_parity(diff, 1e-3)


def test_vllm_error_semantics_of_the_fake(fake, tmp_path, monkeypatch, policy):
    """What the engine's errors rest on, as vLLM 0.33 answers (read in vllm/entrypoints/openai/models/serving.py)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    load = httpx.post(fake.url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nonexistent"},
                      headers=auth)
    assert load.status_code == 404 and load.json()["error"]["message"] == \
        "Loading lora x failed: No adapter found for /nonexistent"
    unload = httpx.post(fake.url + "/v1/unload_lora_adapter", json={"lora_name": "nope"}, headers=auth)
    assert unload.status_code == 404 and "cannot be found" in unload.json()["error"]["message"]
    assert httpx.post(fake.url + "/v1/completions", json={"model": "nope", "prompt": [1]},
                      headers=auth).status_code == 404
    assert httpx.get(fake.url + "/v1/models").status_code == 401
    engine = engine_for(fake, tmp_path, monkeypatch)
    new_version(policy, 1)
    engine.update_adapter(adapter_named_tensors(policy), 1)
    again = httpx.post(fake.url + "/v1/load_lora_adapter", json={"lora_name": "ctu-v1", "lora_path": str(
        tmp_path / "w" / "ctu-v1")}, headers=auth)
    assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]


def test_connect_names_what_the_server_lacks(fake, tmp_path, monkeypatch):
    engine = engine_for(fake, tmp_path, monkeypatch)
    fake.runtime_lora = False
    with pytest.raises(ServedEngineError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
        engine.connect("adapter", lora=True)
    fake.runtime_lora, fake.max_loras = True, 1
    with pytest.raises(ServedEngineError, match="--max-loras is 1, training needs >= 2"):
        engine.connect("adapter", lora=True)
    fake.max_loras, fake.dev_mode = 2, False
    with pytest.raises(ServedEngineError, match="VLLM_SERVER_DEV_MODE=1.*lora.enabled=true"):
        engine.connect("merged", lora=False)
    engine.connect("adapter", lora=True)  # LoRA without dev mode: no /reset_prefix_cache, names keep KV apart
    monkeypatch.setenv("SERVED_KEY", "sk-wrong")
    with pytest.raises(ServedEngineError, match="HTTP 401.*engine.api_key_env") as caught:
        ServedEngine(fake.url + "/v1", fake.name, weights_dir=str(tmp_path), api_key_env="SERVED_KEY").connect(
            "adapter", lora=True)
    assert "sk-wrong" not in str(caught.value)


def test_merged_weights_reload_through_the_dev_routes_with_a_version_stamp(fake, tmp_path, monkeypatch):
    from ctu.train.weights import hf_name

    engine = engine_for(fake, tmp_path, monkeypatch)
    engine.connect("merged", lora=False)
    model = load_model("tiny-random", dtype=torch.float32, device="cpu").eval()
    original = {k: v.clone() for k, v in fake.base.state_dict().items()}
    try:
        with torch.no_grad():
            model.model.layers[0].self_attn.q_proj.weight.mul_(3.0)
        engine.update_weights(((hf_name(n) or n, p.detach()) for n, p in model.named_parameters()), version=5)
        assert engine.weights_version == 5 and fake.weight_version == "ctu-v5"
        assert [e.split(" ")[0] for e in fake.events] == ["reload", "reset"]
        check_parity(probe_parity(engine, score_with(model), tokens=8), 1e-3)
    finally:
        fake.base.load_state_dict(original)


def test_an_inexact_logprobs_mode_is_warned_and_the_probe_sees_it(fake, policy, tmp_path, monkeypatch, caplog):
    fake.logprobs_mode = "raw_logprobs"
    engine = engine_for(fake, tmp_path, monkeypatch)
    engine.connect("adapter", lora=True)
    new_version(policy, 3)
    engine.update_adapter(adapter_named_tensors(policy), 1)
    with caplog.at_level(logging.WARNING):
        diff = probe_parity(engine, score_with(policy), temperature=0.5, tokens=8)
    assert "raw_logprobs" in caplog.text
    with pytest.raises(ParityError):
        check_parity(diff, 1e-2)


def test_a_resumed_run_reuses_the_names_an_earlier_run_left_loaded(fake, policy, tmp_path, monkeypatch):
    earlier = engine_for(fake, tmp_path, monkeypatch)
    new_version(policy, 1)
    earlier.update_adapter(adapter_named_tensors(policy), 3)  # then it crashed: ctu-v3 stays on the server
    resumed = engine_for(fake, tmp_path, monkeypatch)
    resumed.connect("adapter", lora=True)
    assert fake.adapters == {}
    new_version(policy, 2)
    resumed.update_adapter(adapter_named_tensors(policy), 3)
    check_parity(probe_parity(resumed, score_with(policy), tokens=8), 1e-3)
    assert resumed.tag != earlier.tag and fake.adapters["ctu-v3"][0].endswith(resumed.tag)  # a new path: new KV hash
