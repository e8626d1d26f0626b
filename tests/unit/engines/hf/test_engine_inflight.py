"""trainer.inflight on the hf engine: a weight load that arrives while a generation call decodes.

``finish``: the call ends on the old weights, then the load (every token the old version). ``abort``: the call's
unfinished rows stop at the next token, the load goes in, and they are sampled again from scratch (every token the
new version, their logprobs the new weights'). ``continue``: they stop, the load goes in, and they go on from the
tokens sampled so far: the first tokens are the old version's with the old weights' logprobs, the rest the new
version's with the new weights' logprobs given everything before them."""

import threading
import time

import pytest
import torch

from ctu.engines.base import SamplingParams
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.models import load_model, load_tokenizer

PROMPT = [1, 520, 33, 88, 2, 198, 1, 520]
TOKENS = 48


def new_weights(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(n, p.detach() + 0.5 * torch.randn(p.shape, generator=g)) for n, p in model.named_parameters()
            if "layers." in n and p.dim() == 2]


def teacher_forced(model, prompt, ids):
    """log_softmax of the sampled ids given everything before them (temperature 1)."""
    x = torch.tensor([list(prompt) + list(ids)])
    with torch.no_grad():
        logits = model(x).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


def generate_with_a_load_midway(mode):
    torch.manual_seed(0)
    model = load_model("tiny-random")
    engine = HFEngine(model, load_tokenizer("tiny-random"), inflight=mode, kv_reuse=False)
    engine.weights_version = 0
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    weights = new_weights(model)
    params = SamplingParams(temperature=1.0, max_tokens=TOKENS, seed=3, stop_token_ids=())
    engine.eos_ids = set()  # a random model may sample its EOS: decode every token
    completion = generate_while_loading(engine, params, lambda: engine.decode_steps,
                                        lambda: engine.update_weights(weights, version=1))
    return engine, model, old, completion


def generate_while_loading(engine, params, decode_steps, load):
    """``engine.generate_sync`` of :data:`PROMPT` in a thread; ``load()`` once ``decode_steps()`` reaches 5; the
    completion."""
    out = {}
    thread = threading.Thread(target=lambda: out.update(c=engine.generate_sync([PROMPT], params)[0][0]))
    thread.start()
    deadline = time.monotonic() + 60
    while decode_steps() < 5 and time.monotonic() < deadline:
        time.sleep(0.001)
    load()
    thread.join(120)
    return out["c"]


def with_weights(model, state):
    twin = load_model("tiny-random")
    twin.load_state_dict({**model.state_dict(), **state})
    return twin.eval()


@pytest.mark.parametrize("mode", ["finish", "abort", "continue"])
def test_a_load_midway(mode):
    engine, model, old, c = generate_with_a_load_midway(mode)
    assert len(c.token_ids) == TOKENS and c.finish_reason == "length"
    versions = c.versions()
    new = teacher_forced(model.eval(), PROMPT, c.token_ids)
    before = teacher_forced(with_weights(model, old), PROMPT, c.token_ids)
    got = torch.tensor(c.logprobs)
    if mode == "finish":
        assert versions == [0] * TOKENS and engine.interrupted_rows == 0
        torch.testing.assert_close(got, before, rtol=1e-4, atol=1e-4)
    elif mode == "abort":
        assert versions == [1] * TOKENS and engine.interrupted_rows == 1
        torch.testing.assert_close(got, new, rtol=1e-4, atol=1e-4)
    else:
        switch = versions.index(1)
        assert 5 <= switch < TOKENS and versions == [0] * switch + [1] * (TOKENS - switch)
        assert c.version == 0 and engine.interrupted_rows == 1  # the oldest version, for the staleness rule
        torch.testing.assert_close(got[:switch], before[:switch], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[switch:], new[switch:], rtol=1e-4, atol=1e-4)


def test_a_row_at_its_last_token_when_a_load_comes_keeps_the_version_that_sampled_it(monkeypatch):
    """continue: a load that comes as a row samples its last token does not cut the row (nothing is left to
    sample): every token keeps the old version. Cut and sent again with no budget left, the row came back stamped
    with the new version and no per-token versions, one version younger than it is."""
    from ctu.engines.hf import engine as hf_engine

    torch.manual_seed(0)
    model = load_model("tiny-random")
    engine = HFEngine(model, load_tokenizer("tiny-random"), inflight="continue", kv_reuse=False)
    engine.weights_version, engine.eos_ids = 0, set()
    weights, params = new_weights(model), SamplingParams(temperature=1.0, max_tokens=6, seed=3, stop_token_ids=())
    real, calls, loads = hf_engine.sample_next, [], []

    def sample_next(*args, **kwargs):  # the last token: a load comes and waits for the engine's lock
        calls.append(1)
        if len(calls) == params.max_tokens:
            loads.append(threading.Thread(target=engine.update_weights, args=(weights,), kwargs={"version": 1}))
            loads[0].start()
            while not engine._pending_loads:
                time.sleep(0.001)
        return real(*args, **kwargs)

    monkeypatch.setattr(hf_engine, "sample_next", sample_next)
    c = engine.generate_sync([PROMPT], params)[0][0]
    loads[0].join(60)
    assert len(c.token_ids) == 6 and c.versions() == [0] * 6 and c.version == 0
    assert engine.interrupted_rows == 0 and engine.weights_version == 1
