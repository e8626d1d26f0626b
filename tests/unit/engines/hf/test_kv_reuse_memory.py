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


def test_each_layer_of_a_continued_entry_is_freed_before_the_next_layer_of_the_batch_is_made(monkeypatch):
    """Layer by layer: when the batch's layer l is allocated, the entries' layers before l are gone, so the batch's
    KV and the entries' are never held whole together (a transient second copy of every cached token)."""
    store, layers = kvr.KVStore(10_000), 4
    for n in range(2):
        ids = tuple(range(100 * (n + 1), 100 * (n + 1) + 30))
        store.add(kvr.Entry(ids, None, [(torch.randn(1, 3, 30, 8), torch.randn(1, 3, 30, 8)) for _ in range(layers)]))
    alive = [[weakref.ref(t) for t in pair] for e in store.entries.values() for pair in e.kv]  # entry-major
    prompts = [e.ids + (7,) for e in store.entries.values()]
    batch = kvr.plan(store, prompts, lambda prefix: None)
    seen, real = [], torch.Tensor.new_empty

    def new_empty(self, *args, **kwargs):  # the batch's keys, then its values, of each layer
        seen.append([[all(ref() is None for ref in alive[e * layers + lay]) for lay in range(layers)] for e in range(2)])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "new_empty", new_empty)
    kvr.assemble(batch, 0, "cpu", lambda ls: DynamicCache(ddp_cache_data=ls))
    monkeypatch.undo()
    assert seen == [[[lay < call // 2 for lay in range(layers)]] * 2 for call in range(2 * layers)]


def test_a_batch_that_ends_is_kept_layer_by_layer_as_each_row_alone():
    """keep_rows stores what keep_row stores for each row, and lets go of each layer of the batch before copying the
    next: in ``release(l)`` no reference to the batch's layer l is left but the cache's own."""
    layers, heads, width = 3, 2, 12
    prompts = [tuple(range(10, 18)), tuple(range(20, 26))]
    batch = kvr.Batch(None, [kvr.Row(p, False, None, p) for p in prompts])
    mask = torch.tensor([[1] * 10 + [0, 0], [0, 0] + [1] * 9 + [0]])
    fed = [[1, 2], [3, 4, 5]]  # row 1 ran 6 + 3 = 9 real columns
    tensors = [(torch.randn(2, heads, width, 4), torch.randn(2, heads, width, 4)) for _ in range(layers)]
    one = kvr.KVStore(10_000)
    for j in range(2):
        kvr.keep_row(one, batch, j, [(k[j:j + 1], v[j:j + 1]) for k, v in tensors], mask[j], fed[j])
    refs = [weakref.ref(k) for k, _ in tensors]
    cache = list(tensors)  # stands for the cache's own references
    del tensors
    released = []

    def release(layer):
        cache[layer] = None
        released.append([ref() is None for ref in refs])

    together = kvr.KVStore(10_000)
    kvr.keep_rows(together, batch, [(0, 0, fed[0]), (1, 1, fed[1])], [c for c in cache], mask, release)
    assert released == [[lay <= layer for lay in range(layers)] for layer in range(layers)]
    a, b = list(one.entries.values()), list(together.entries.values())
    assert [e.ids for e in a] == [e.ids for e in b] == [prompts[0] + (1, 2), prompts[1] + (3, 4, 5)]
    for x, y in zip(a, b, strict=True):
        assert all(torch.equal(p, q) for (pk, pv), (qk, qv) in zip(x.kv, y.kv, strict=True) for p, q in ((pk, qk), (pv, qv)))


def test_an_assembled_batch_is_the_caches_buffer_through_prefill_and_decode():
    """assemble(..., generate=n) with kv_buffer.adopt: the cache's layers are the assembled tensors themselves
    (DynamicCache(ddp_cache_data=...) concatenated each onto an empty one: a second copy of the batch's KV), with
    room for the new ids and n generated ones, written in place."""
    from ctu.engines.hf.kv_buffer import adopt, preallocate

    store = kvr.KVStore(10_000)
    ids = tuple(range(100, 130))
    kv = [(torch.randn(1, 3, 30, 8), torch.randn(1, 3, 30, 8)) for _ in range(2)]
    store.add(kvr.Entry(ids, None, [(k.clone(), v.clone()) for k, v in kv]))
    batch = kvr.plan(store, [ids + (7, 8)], lambda prefix: None)
    made = []
    _, _, _, cache = kvr.assemble(batch, 0, "cpu", lambda layers: made.append(layers) or adopt(layers), generate=4)
    start = [layer.keys.data_ptr() for layer in cache.layers]
    assert start == [k.data_ptr() for k, _ in made[0]]  # no copy
    for layer, (k, _) in zip(cache.layers, kv, strict=True):
        layer.update(torch.ones(1, 3, 2, 8), torch.ones(1, 3, 2, 8))  # the prefill's 2 new ids
        assert torch.equal(layer.keys[:, :, :30], k) and torch.equal(layer.values[:, :, 30:], torch.ones(1, 3, 2, 8))
    preallocate(cache, 4)  # the room is there: nothing moves
    for _ in range(4):
        for layer in cache.layers:
            layer.update(torch.zeros(1, 3, 1, 8), torch.zeros(1, 3, 1, 8))
    assert [layer.keys.data_ptr() for layer in cache.layers] == start
    assert all(layer.keys.shape[-2] == 36 and layer.reallocations == 0 for layer in cache.layers)
