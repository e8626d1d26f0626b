"""The hf engine's decode KV cache lives in buffers allocated once: the same tokens and logprobs as the cache grown by
``torch.cat``, and each layer's buffer is the same memory from the first decode step to the last."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from transformers.cache_utils import DynamicCache

import ctu.engines.hf.engine as hf
from ctu.engines.base import SamplingParams
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.hf_api import CACHE
from ctu.engines.hf.kv_buffer import BufferedLayer, preallocate
from ctu.engines.hf.models import load_model, load_tokenizer

PROMPTS = [[1, 520, 33, 88, 2, 198, 1, 520], [1, 77, 4000], [1, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    torch.manual_seed(0)
    return load_model("tiny-random"), load_tokenizer("tiny-random")


def outputs(model, tokenizer, kv_reuse: bool, buffered: bool, **kw):
    engine = HFEngine(model, tokenizer, max_batch_size=8, kv_reuse=kv_reuse)
    engine.eos_ids = set()  # every row decodes to the end: the longest run of steps
    params = SamplingParams(max_tokens=12, **kw)
    with mock.patch.object(hf, "preallocate", hf.preallocate if buffered else lambda cache, more: None):
        first = engine.generate_sync(PROMPTS, params)
        # the next turn of each conversation: served from the kept KV (kv_reuse), prefilled whole otherwise
        second = engine.generate_sync([p + list(c[0].token_ids) + [5, 6] for p, c in zip(PROMPTS, first, strict=True)],
                                      params)
    return [(c.token_ids, c.logprobs) for out in (first, second) for cs in out for c in cs]


@pytest.mark.parametrize("kv_reuse", [True, False])
@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "top_p": 0.9, "seed": 3, "n": 2}])
def test_buffered_decode_samples_the_same_tokens_and_logprobs(model_and_tokenizer, kv_reuse, sampling):
    model, tokenizer = model_and_tokenizer
    assert (outputs(model, tokenizer, kv_reuse, True, **sampling)
            == outputs(model, tokenizer, kv_reuse, False, **sampling))


def test_each_step_writes_in_place_and_never_grows_the_cache(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = HFEngine(model, tokenizer, max_batch_size=8)
    engine.eos_ids = set()
    seen: list[tuple[int, int, int]] = []  # (layer 0's buffer address, its keys' address, their length) per step
    real = model.forward

    def spy(*args, **kwargs):
        cache = kwargs.get(CACHE)
        if cache is not None and isinstance(cache.layers[0], BufferedLayer):
            layer = cache.layers[0]
            seen.append((layer._key_buffer.data_ptr(), layer.keys.data_ptr(), layer.keys.shape[-2]))
        return real(*args, **kwargs)

    with mock.patch.object(model, "forward", spy):
        engine.generate_sync(PROMPTS, SamplingParams(max_tokens=10, temperature=0.0))
    assert len(seen) == 10  # every decode step ran on the buffered cache (the last token is fed too)
    assert len({(buf, keys) for buf, keys, _ in seen}) == 1  # one buffer, the keys a view of it, all along
    assert [n for _, _, n in seen] == list(range(seen[0][2], seen[0][2] + 10))


def test_a_replaced_tensor_or_a_full_buffer_moves_to_a_new_buffer():
    cache = DynamicCache()
    k = torch.arange(2 * 3 * 4 * 2, dtype=torch.float32).reshape(2, 3, 4, 2)
    cache.update(k, k + 1, 0)
    preallocate(cache, 2)
    layer = cache.layers[0]
    assert type(layer) is BufferedLayer and layer.capacity == 6
    for step in range(3):  # the third overflows the room: a larger buffer, the same contents
        new = torch.full((2, 3, 1, 2), float(step))
        keys, values = layer.update(new, new + 1)
        k = torch.cat([k, new], dim=-2)
        assert torch.equal(keys, k) and torch.equal(values, k + 1)
    assert layer.reallocations == 1 and layer.capacity >= 7
    cache.batch_select_indices(torch.tensor([1]))  # rows leave: ordinary tensors, copied back into a buffer
    keys, _ = layer.update(torch.zeros(1, 3, 1, 2), torch.zeros(1, 3, 1, 2))
    assert torch.equal(keys, torch.cat([k[1:], torch.zeros(1, 3, 1, 2)], dim=-2)) and layer._owns()
