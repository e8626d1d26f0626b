"""A decode holds its batch's KV once: the entries a batch continues are freed when their KV has been copied into
the batch (before, the batch's rows kept them alive through the whole decode, a second copy of the cached KV: the
quickstart's evaluations peaked at 3.6 GiB with 32 episodes in flight)."""

import weakref

import torch
from transformers.cache_utils import DynamicCache

from ctu.engines.hf import kv_reuse as kvr


def test_continued_entries_are_freed_once_copied_into_the_batch():
    store = kvr.KVStore(10_000)
    ids = tuple(range(100, 140))
    kv = [(torch.randn(1, 3, len(ids), 8), torch.randn(1, 3, len(ids), 8)) for _ in range(2)]
    store.add(kvr.Entry(ids, None, kv))
    alive = [weakref.ref(t) for layer in kv for t in layer]
    first_keys = kv[0][0].clone()
    del kv
    batch = kvr.plan(store, [ids + (7, 8, 9)], lambda prefix: None)
    assert batch.rows[0].cached_length == len(ids) and not store.entries  # continued: the store let go of it
    ids_, mask, positions, cache = kvr.assemble(batch, 0, "cpu", lambda layers: DynamicCache(ddp_cache_data=layers))
    assert all(ref() is None for ref in alive)  # only the batch's copy is left
    assert torch.equal(cache.layers[0].keys[:, :, -len(ids):], first_keys)
    assert ids_.tolist() == [[7, 8, 9]] and mask.shape == (1, len(ids) + 3)
