"""The hf engine keeps each conversation's KV cache across turns: same tokens and logprobs as prefilling whole
prompts, bounded memory, never stale weights."""

import asyncio

import pytest
import torch

from ctu.domains import get_domain
from ctu.engines.base import SamplingParams
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.kv_reuse import KVStore
from ctu.engines.hf.models import load_model, load_tokenizer
from ctu.episode.users.base import UserSession, UserSimulator
from ctu.rollout.chat import ChatFormat
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout


class PatientUser(UserSimulator):
    """Answers every agent message (a scripted user would stop at the random model's first reply)."""

    class Session(UserSession):
        def __init__(self, task):
            self.task, self.replies = task, 0

        async def reply(self, agent_message):
            self.replies += 1
            return f"Hello, about {self.task.id}." if self.replies == 1 else f"Please try again ({self.replies})."

    def start(self, domain, task, seed=0):
        return self.Session(task)


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


def engines(model, tokenizer, **kw):
    return (HFEngine(model, tokenizer, max_batch_size=8, kv_reuse=True, **kw),
            HFEngine(model, tokenizer, max_batch_size=8, kv_reuse=False))


def gen(engine, prompts, seeds=None, **kw):
    return asyncio.run(engine.generate(prompts, SamplingParams(**kw), seeds=seeds))


def assert_same(a, b):
    """Same tokens; logprobs equal up to float rounding (relative to their size)."""
    for ca, cb in zip(a, b, strict=True):
        for x, y in zip(ca, cb, strict=True):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), rtol=1e-4, atol=1e-4)


def run_episodes(engine, tokenizer, params, episodes=6):
    mini = get_domain("mini")
    specs = [EpisodeSpec(mini, mini.tasks[i % 3], i) for i in range(episodes)]
    return asyncio.run(rollout(specs, ChatFormat(tokenizer), engine, PatientUser(), params,
                               RolloutLimits(max_turns=4, max_context_tokens=2048), concurrency=4, max_batch_size=4))


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=0.9, top_k=40, seed=5)],
                         ids=["greedy", "seeded"])
def test_multi_turn_episodes_equal_the_no_cache_reference(model, tokenizer, sampling):
    # seeded among 40 candidates: the random model's next-token distribution is nearly flat over 49,152 tokens,
    # where the float rounding by which the two paths' logits differ (~1e-6) moves the sampler's cumulative sums
    # across a token's boundary in a few draws of a thousand; over 40 candidates of ~2.5% each it never does
    # the first 10000 ids end a turn, so the random model ends turns early and episodes go on for several turns
    params = SamplingParams(max_tokens=16, stop_token_ids=tuple(range(10000)), **sampling)
    reuse, plain = engines(model, tokenizer)
    a = run_episodes(reuse, tokenizer, params)
    b = run_episodes(plain, tokenizer, params)
    assert sum(t.turns for t in a) > len(a)  # multi-turn, or the test proves nothing
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids and x.loss_mask == y.loss_mask and x.stop_reason == y.stop_reason
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), rtol=1e-4, atol=1e-4)
    store = reuse.kv_store
    assert store.hits > 2 * store.misses  # later turns ran only their new tokens
    if sampling["temperature"] > 0:  # (greedy, the random model ends every turn at its first token)
        assert reuse.rows_retired > 0  # rows that finished early left their batch
    assert not store.entries  # every finished episode released its cache


def test_mixed_batch_continuations_new_rows_duplicates_and_n(model, tokenizer):
    reuse, plain = engines(model, tokenizer)
    system = list(range(1000, 1040))
    first = [system + [5, 6, 7], system + [8, 9], system + [10, 11, 12, 13]]
    seeds = [11, 12, 13]
    kw = dict(temperature=1.0, max_tokens=6)
    out = gen(reuse, first, seeds, **kw)
    assert_same(out, gen(plain, first, seeds, **kw))
    cont = [first[0] + list(out[0][0].token_ids) + [42, 43],  # continues an entry
            first[1] + list(out[1][0].token_ids),  # exactly an entry's ids plus its last token
            system + [77, 78, 79],  # new conversation on the stored prefix
            [3, 1, 4, 1, 5, 9, 2, 6],  # unrelated, no prefix
            first[2] + list(out[2][0].token_ids) + [99]]
    seeds = [21, 22, 23, 24, 25]
    hits_before = reuse.kv_store.hits
    again = gen(reuse, cont, seeds, n=2, **kw)
    assert_same(again, gen(plain, cont, seeds, n=2, **kw))
    # the three continuations and the new row reuse cached tokens: at least the prefix of 4 rows x 2 samples
    assert reuse.kv_store.hits - hits_before >= 8 * len(system)


def test_greedy_equals_plain_when_a_prompt_repeats_an_entry_exactly(model, tokenizer):
    reuse, plain = engines(model, tokenizer)
    prompts = [list(range(2000, 2030)) + [1, 2], list(range(2000, 2030)) + [3]]
    out = gen(reuse, prompts, temperature=0.0, max_tokens=5)
    again = [prompts[0] + list(out[0][0].token_ids[:-1])]  # the entry's ids exactly: the last one is re-run
    assert_same(gen(reuse, again, temperature=0.0, max_tokens=5), gen(plain, again, temperature=0.0, max_tokens=5))


def test_rows_that_finish_early_leave_the_batch_without_changing_the_others(model, tokenizer):
    prompts = [list(range(4000, 4030)) + [i] for i in range(8)]
    seeds = list(range(8))
    free = gen(HFEngine(model, tokenizer, kv_reuse=False), prompts, seeds, temperature=1.0, max_tokens=10)
    # stop ids that end rows at different steps (per-request seeds: the same draws up to the stop)
    stops = {c[0].token_ids[k] for c, k in zip(free, (1, 3, 5, 7, 9, 2, 4, 6), strict=True)}
    reuse, plain = engines(model, tokenizer)
    kw = dict(temperature=1.0, max_tokens=10, stop_token_ids=tuple(stops))
    out = gen(reuse, prompts, seeds, **kw)
    assert_same(out, gen(plain, prompts, seeds, **kw))
    assert len({len(c[0].token_ids) for c in out}) > 2 and reuse.rows_retired > 0
    cont = [p + list(c[0].token_ids) + [5, 6] for p, c in zip(prompts, out, strict=True)]  # from the retired rows' KV
    assert_same(gen(reuse, cont, seeds, **kw), gen(plain, cont, seeds, **kw))
    assert reuse.kv_store.hits >= sum(len(p) for p in prompts)


def test_changed_weights_never_use_stale_kv(model, tokenizer):
    reuse, plain = engines(model, tokenizer)
    prompts = [list(range(500, 540)) + [1, 2, 3], list(range(500, 540)) + [4, 5]]
    out = gen(reuse, prompts, temperature=0.0, max_tokens=4)
    cont = [p + list(c[0].token_ids) + [7, 8] for p, c in zip(prompts, out, strict=True)]
    param = next(p for n, p in model.named_parameters() if "layers.0.self_attn.k_proj" in n)
    saved = param.detach().clone()
    try:
        with torch.no_grad():  # in place, as an optimizer step on a shared model does
            param.add_(torch.randn_like(param))
        assert_same(gen(reuse, cont, temperature=0.0, max_tokens=4), gen(plain, cont, temperature=0.0, max_tokens=4))
        out = gen(reuse, prompts, temperature=0.0, max_tokens=4)
        reuse.update_weights([("model.layers.0.self_attn.k_proj.weight", saved)])
        assert not reuse.kv_store.entries and not reuse.kv_store.prefixes
    finally:
        with torch.no_grad():
            param.copy_(saved)


def test_cache_stays_under_its_token_cap_and_release_frees_it(model, tokenizer):
    reuse = HFEngine(model, tokenizer, max_batch_size=8, kv_cache_tokens=120)
    prompts = [list(range(3000, 3030)) + [i, i + 1] for i in range(6)]
    out = gen(reuse, prompts, temperature=0.0, max_tokens=4)
    assert 0 < reuse.kv_store.tokens() <= 120
    for p, (c,) in zip(prompts, out, strict=True):
        reuse.release(p + list(c.token_ids))
    assert not reuse.kv_store.entries
    with pytest.raises(ValueError, match="max_tokens"):
        KVStore(0)


def test_config_switches_the_cache_off(model, tokenizer):
    from ctu.config.schema import load_config
    from ctu.rollout.components import build_engine

    on = build_engine(load_config(None, ["engine.kv_cache_tokens=99"]), model=model, tokenizer=tokenizer)
    off = build_engine(load_config(None, ["engine.kv_reuse=false"]), model=model, tokenizer=tokenizer)
    assert on.kv_store is not None and on.kv_store.max_tokens == 99 and off.kv_store is None
