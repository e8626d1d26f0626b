"""trainer.inflight on the served engine: an adapter load that arrives while the server decodes a long completion.

``finish``: the request ends on the weights it named (every token the old version). ``abort`` and ``continue``:
ctu pauses the server (``POST /pause?mode=abort``: its running requests return what they sampled, finish_reason
``abort``), loads, resumes (``POST /resume``); ``abort`` samples the stopped rows again from scratch on the new
adapter, ``continue`` sends prompt + the tokens sampled so far as the new prompt, with what is left of max_tokens.
Each token's version and logprob are those of the weights that sampled it."""

import time

import httpx
import pytest
import torch

from ctu.config.schema import ConfigError
from ctu.engines.base import SamplingParams
from ctu.engines.vllm.served import ServedEngine
from ctu.train.sync import adapter_named_tensors
from tests.fakes.fake_vllm_server import FakeVLLMServer
from tests.unit.engines.hf.test_engine_inflight import PROMPT, generate_while_loading, teacher_forced
from tests.unit.engines.vllm.test_engine_served import new_version, policy  # noqa: F401 - policy: the PEFT fixture

TOKENS = 48


@pytest.fixture
def fake():
    with FakeVLLMServer() as server:
        server.engines[server.name].eos_ids = set()  # a random model may sample its EOS: decode every token
        hook = server.base.register_forward_pre_hook(lambda *_: time.sleep(0.01))  # a server busy long enough
        yield server
        hook.remove()


def engine_for(fake, tmp_path, mode):
    engine = ServedEngine(fake.url + "/v1", fake.name, weights_dir=str(tmp_path / "w"), keep=2, lora_alpha=16,
                          inflight=mode)
    engine.connect("adapter", lora=True)
    return engine


def generate_with_a_load_midway(fake, policy, tmp_path, mode):  # noqa: F811
    engine = engine_for(fake, tmp_path, mode)
    base = fake.engines[fake.name]
    params = SamplingParams(temperature=1.0, max_tokens=TOKENS, seed=3)

    def load():
        new_version(policy, 1)
        engine.update_adapter(adapter_named_tensors(policy), 1)

    return engine, generate_while_loading(engine, params, lambda: base.decode_steps, load)


@pytest.mark.parametrize("mode", ["finish", "abort", "continue"])
def test_a_load_midway_through_a_served_completion(fake, policy, tmp_path, mode):  # noqa: F811
    engine, c = generate_with_a_load_midway(fake, policy, tmp_path, mode)
    assert len(c.token_ids) == TOKENS and c.finish_reason == "length"
    versions = c.versions()
    got = torch.tensor(c.logprobs)
    before = teacher_forced(fake.base, PROMPT, c.token_ids)
    after = teacher_forced(fake.adapters["ctu-v1"][1], PROMPT, c.token_ids)
    control = [e.split(" ")[0] for e in fake.events if not e.startswith("complete")]
    if mode == "finish":
        assert versions == [0] * TOKENS and engine.interrupted_rows == 0 and control == ["load", "reset"]
        torch.testing.assert_close(got, before, rtol=1e-4, atol=1e-4)
        return
    assert control == ["pause", "load", "reset", "resume"] and engine.interrupted_rows == 1
    resent = fake.requests[-1]
    assert resent["model"] == "ctu-v1" and fake.aborted == 1
    if mode == "abort":
        assert versions == [1] * TOKENS and resent["prompt"] == PROMPT and resent["max_tokens"] == TOKENS
        torch.testing.assert_close(got, after, rtol=1e-4, atol=1e-4)
    else:
        switch = versions.index(1)
        assert 5 <= switch < TOKENS and versions == [0] * switch + [1] * (TOKENS - switch)
        assert c.version == 0  # the oldest version, for the staleness rule
        assert resent["prompt"] == PROMPT + list(c.token_ids[:switch]) and resent["max_tokens"] == TOKENS - switch
        torch.testing.assert_close(got[:switch], before[:switch], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[switch:], after[switch:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["abort", "continue"])
def test_a_pause_that_stops_nothing_is_said_once(fake, policy, tmp_path, mode, caplog):  # noqa: F811
    """A server that answers /pause only once its running requests ended: they ran to their end on the old weights
    (stamped with that version, as trainer.inflight=finish would), and the run says so once, naming the mode."""
    fake.pause_after_running = True
    with caplog.at_level("WARNING", logger="ctu.engines"):
        engine, c = generate_with_a_load_midway(fake, policy, tmp_path, mode)
        v1 = fake.engines["ctu-v1"]  # serving the next request
        steps, params = v1.decode_steps, SamplingParams(temperature=1.0, max_tokens=TOKENS, seed=4)
        again = generate_while_loading(engine, params, lambda: v1.decode_steps - steps, lambda: engine.update_adapter(
            adapter_named_tensors(new_version(policy, 2) or policy), 2))
    assert c.versions() == [0] * TOKENS and again.versions() == [1] * TOKENS and c.finish_reason == "length"
    assert engine.interrupted_rows == 0 and fake.aborted == 0 and engine.unstopped_rows == 2
    said = [r.getMessage() for r in caplog.records if "/pause" in r.getMessage()]
    assert len(said) == 1 and f"trainer.inflight={mode}" in said[0] and "ran to their end" in said[0], said


@pytest.mark.parametrize("mode", ["abort", "continue"])
def test_a_server_without_the_pause_routes_is_refused_at_connect(fake, tmp_path, mode):
    fake.dev_mode = False
    with pytest.raises(ConfigError, match=rf"^trainer\.inflight: {mode} .*VLLM_SERVER_DEV_MODE=1"):
        engine_for(fake, tmp_path, mode)
    assert not [e for e in fake.events if e.startswith(("load", "pause", "complete"))]


def test_a_sleeping_server_wakes_its_weights_to_load_then_its_kv_cache(fake, policy, tmp_path):  # noqa: F811
    """vllm/entrypoints/serve/dev/sleep/api_router.py: POST /sleep?level=1 (weights to host RAM, KV cache dropped;
    dev mode), POST /wake_up?tags=weights then ?tags=kv_cache ("sleeping" until both are awake). A served engine
    with sleep mode sleeps once, wakes the weights before a load and the KV cache after, and generates awake."""
    engine = ServedEngine(fake.url + "/v1", fake.name, weights_dir=str(tmp_path / "w"), keep=2, lora_alpha=16,
                          sleep_mode=True)
    engine.connect("adapter", lora=True)
    engine.sleep()
    engine.sleep()  # asleep already: nothing sent
    assert fake.sleeping == {"weights", "kv_cache"}
    new_version(policy, 1)
    engine.update_adapter(adapter_named_tensors(policy), 1)
    engine.wake_up()  # awake already: nothing sent
    engine.generate_sync([PROMPT], SamplingParams(max_tokens=4))
    control = [e for e in fake.events if not e.startswith("complete")]
    assert control == ["sleep 1", "wake weights", "wake kv_cache", "load ctu-v1", "reset"] and not fake.sleeping
    plain = ServedEngine(fake.url + "/v1", fake.name, weights_dir=str(tmp_path / "p"), keep=2)
    plain.sleep()  # without sleep mode (an attached or CPU server): a no-op
    assert not fake.sleeping and httpx.get(fake.url + "/is_sleeping").json() == {"is_sleeping": False}
