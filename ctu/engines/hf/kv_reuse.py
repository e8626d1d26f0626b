"""KV caches kept across an episode's turns, for the in-process (hf) engine.

A multi-turn episode's next prompt is its previous prompt, the ids sampled for it, and the observation
(token-in-token-out: only ever appended to). Re-running that whole context every turn is most of a CPU
rollout's model time; with the cache kept, a turn runs only its new tokens (the last sampled one and the
observation).

Content-addressed, so it can never serve the KV of other tokens: an entry is (token ids, the KV of exactly
those ids, compacted: no padding), and a prompt reuses the longest entry whose ids begin it. Entries share the
KV of a common prefix (a domain's system prompt) by reference. Bounded: at most ``max_tokens`` cached tokens
(least recently used dropped first); an entry is dropped when a prompt continues it (the continuation replaces
it) or when its conversation is released (the episode ended); the engine drops everything when its weights
change.

A batch is laid out, row by row, as ``[shared prefix | padding | cached KV | padding | new tokens]`` with an
attention mask over the padding and position ids that skip it, as :func:`ctu.engines.hf.shared_prefix.prefill` does.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ctu.engines.hf.shared_prefix import MIN_SHARED, common_prefix_length

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [1, heads, length, head_dim]
GONE = (torch.empty(0), torch.empty(0))  # a layer let go once copied (:func:`assemble`, :func:`keep_rows`)


@dataclass(eq=False)
class Prefix:
    """The KV of a prefix many prompts share (batch 1)."""

    ids: tuple[int, ...]
    kv: KV


@dataclass(eq=False)
class Entry:
    """The KV of ``ids``: ``prefix``'s (shared, by reference) then ``kv`` for the ids after it."""

    ids: tuple[int, ...]
    prefix: Prefix | None
    kv: KV

    @property
    def start(self) -> int:
        return len(self.prefix.ids) if self.prefix is not None else 0


class KVStore:
    """Entries and shared prefixes, at most ``max_tokens`` cached tokens in all (a shared prefix counts once)."""

    def __init__(self, max_tokens: int = 32768):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # id(entry) -> entry, least recently used first
        self.prefixes: OrderedDict[tuple[int, ...], Prefix] = OrderedDict()
        self.hits = 0  # tokens served from the cache
        self.misses = 0  # prompt tokens that had to be run

    def tokens(self) -> int:
        return (sum(len(e.ids) - e.start for e in self.entries.values())
                + sum(len(p.ids) for p in self.prefixes.values()))

    def clear(self) -> None:
        self.entries.clear()
        self.prefixes.clear()

    def match(self, prompt: tuple[int, ...]) -> tuple[Entry | None, int]:
        """The longest entry whose ids begin ``prompt``, and how many of its tokens to use (at most
        ``len(prompt) - 1``: the last prompt token is always run, its logits start the generation)."""
        best = None
        for entry in self.entries.values():
            n = len(entry.ids)
            if n <= len(prompt) and (best is None or n > len(best.ids)) and prompt[:n] == entry.ids:
                best = entry
        if best is None:
            return None, 0
        return best, min(len(best.ids), len(prompt) - 1)

    def match_prefix(self, prompt: tuple[int, ...]) -> Prefix | None:
        best = None
        for ids, prefix in self.prefixes.items():
            if len(ids) < len(prompt) and (best is None or len(ids) > len(best.ids)) and prompt[:len(ids)] == ids:
                best = prefix
        return best

    def add(self, entry: Entry) -> None:
        self.entries[id(entry)] = entry
        if entry.prefix is not None:
            self.prefixes[entry.prefix.ids] = entry.prefix
            self.prefixes.move_to_end(entry.prefix.ids)
        self._evict()

    def add_prefix(self, prefix: Prefix) -> None:
        self.prefixes[prefix.ids] = prefix
        self._evict()

    def remove(self, entry: Entry) -> None:
        self.entries.pop(id(entry), None)

    def release(self, ids: Sequence[int]) -> None:
        """Drop the entries of a conversation that ended with ``ids`` (each entry whose ids begin them)."""
        ids = tuple(ids)
        for key, entry in list(self.entries.items()):
            if entry.ids == ids[:len(entry.ids)]:
                del self.entries[key]

    def _evict(self) -> None:
        total = self.tokens()
        while total > self.max_tokens and self.entries:
            _, entry = self.entries.popitem(last=False)
            total -= len(entry.ids) - entry.start
        if total > self.max_tokens:  # only prefixes left: drop those no entry uses, oldest first
            used = {id(e.prefix) for e in self.entries.values()}
            for ids, prefix in list(self.prefixes.items()):
                if total <= self.max_tokens:
                    break
                if id(prefix) not in used:
                    del self.prefixes[ids]
                    total -= len(ids)


@dataclass
class Row:
    """How one prompt of a batch is run: on the shared prefix or not, cached KV after it, new ids to run."""

    prompt: tuple[int, ...]
    on_prefix: bool
    cached: KV | None
    new: tuple[int, ...]
    used: Entry | None = None

    @property
    def cached_length(self) -> int:
        return 0 if self.cached is None else self.cached[0][0].shape[2]


@dataclass
class Batch:
    prefix: Prefix | None
    rows: list[Row] = field(default_factory=list)


def _slice(kv: KV, start: int, stop: int) -> KV:
    return [(k[:, :, start:stop], v[:, :, start:stop]) for k, v in kv]


def _full_kv(entry: Entry, length: int) -> KV:
    """The first ``length`` tokens of ``entry`` as one KV (its prefix and its own part concatenated)."""
    own = _slice(entry.kv, 0, length - entry.start)
    if entry.prefix is None:
        return own
    return [(torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)) for (pk, pv), (k, v) in zip(entry.prefix.kv, own, strict=True)]


def plan(store: KVStore, prompt_ids: Sequence[Sequence[int]], make_prefix) -> Batch:
    """Decide, for each prompt, what comes from the cache. ``make_prefix(ids)`` computes a new shared prefix's KV
    (or returns None) when no stored prefix serves the batch and its prompts share at least ``MIN_SHARED`` ids."""
    prompts = [tuple(p) for p in prompt_ids]
    hits = [store.match(p) for p in prompts]
    candidates = []
    for p, (entry, use) in zip(prompts, hits, strict=True):
        if entry is not None and entry.prefix is not None and use > entry.start:
            candidates.append(entry.prefix)
        else:
            found = store.match_prefix(p)
            if found is not None:
                candidates.append(found)
    prefix = None
    if candidates:
        counts = Counter(id(c) for c in candidates)
        prefix = max(candidates, key=lambda c: (counts[id(c)], len(c.ids)))
    elif len(prompts) > 1:
        shared = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)
        if shared >= MIN_SHARED:
            prefix = make_prefix(prompts[0][:shared])
            if prefix is not None:
                store.add_prefix(prefix)
    batch = Batch(prefix)
    for p, (entry, use) in zip(prompts, hits, strict=True):
        if prefix is not None and len(prefix.ids) < len(p) and p[:len(prefix.ids)] == prefix.ids:
            if entry is not None and entry.prefix is prefix and use > entry.start:
                batch.rows.append(Row(p, True, _slice(entry.kv, 0, use - entry.start), p[use:], entry))
            else:
                batch.rows.append(Row(p, True, None, p[len(prefix.ids):]))
        elif entry is not None and use > 0:
            batch.rows.append(Row(p, False, _full_kv(entry, use), p[use:], entry))
        else:
            batch.rows.append(Row(p, False, None, p))
    for row in batch.rows:
        store.hits += len(row.prompt) - len(row.new)
        store.misses += len(row.new)
        if row.used is not None:  # its continuation replaces it
            store.remove(row.used)
    return batch


def assemble(batch: Batch, pad_id: int, device, make_cache, generate: int = 0):
    """(input ids [B, W], attention mask [B, S + C + W], position ids [B, W], cache or None) for ``batch``.

    ``make_cache(per-layer (keys, values))`` builds the model's cache object from [B, heads, S + C, dim] tensors:
    with ``generate`` > 0, views of the first positions of buffers with room for the new ids and ``generate`` more
    (:func:`ctu.engines.hf.kv_buffer.adopt` keeps them as the cache's buffers: no copy as the cache grows).
    The rows let go of the cached KV they were planned with (the store dropped those entries already), so a decode
    holds its batch's KV once, not also the entries it continues.
    """
    rows, prefix = batch.rows, batch.prefix
    size = len(rows)
    shared = len(prefix.ids) if prefix is not None else 0
    width_cached = max(r.cached_length for r in rows)
    width_new = max(len(r.new) for r in rows)
    past = shared + width_cached
    mask = torch.zeros((size, past + width_new), dtype=torch.long, device=device)
    ids = torch.full((size, width_new), pad_id, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        if r.on_prefix:
            mask[i, :shared] = 1
        mask[i, past - r.cached_length:past] = 1
        mask[i, past + width_new - len(r.new):] = 1
        ids[i, width_new - len(r.new):] = torch.tensor(r.new, dtype=torch.long, device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
    if past == 0:
        return ids, mask, positions, None
    template = prefix.kv if prefix is not None else next(r.cached for r in rows if r.cached is not None)
    lengths = [r.cached_length for r in rows]
    layers = []
    room = past + (width_new + generate if generate else 0)
    for layer in range(len(template)):
        k0, v0 = template[layer]
        keys = k0.new_empty((size, k0.shape[1], room, k0.shape[3]))[:, :, :past].zero_()
        values = v0.new_empty((size, v0.shape[1], room, v0.shape[3]))[:, :, :past].zero_()
        del k0, v0
        if prefix is not None:
            keys[:, :, :shared] = prefix.kv[layer][0]
            values[:, :, :shared] = prefix.kv[layer][1]
        for i, r in enumerate(rows):
            if r.cached is not None:
                keys[i, :, past - lengths[i]:] = r.cached[layer][0][0]
                values[i, :, past - lengths[i]:] = r.cached[layer][1][0]
        for r in rows:  # this layer is in the batch: the continued entries' copy of it is freed now, so that the
            if r.cached is not None:  # batch's KV and the entries' are never held whole together
                r.cached[layer] = GONE
            if r.used is not None:
                r.used.kv[layer] = GONE
        layers.append((keys, values))
    for r in rows:
        r.cached, r.used = None, None
    return ids, mask, positions, make_cache(layers)


def keep_row(store: KVStore, batch: Batch, i: int, layers: KV, mask: torch.Tensor, fed: Sequence[int]) -> None:
    """Store row ``i``'s KV after generation: its prompt and the generated ids ``fed`` that were run.

    ``layers``: per-layer (keys, values) [1, heads, T, dim] of this row; ``mask`` [T] its attention mask (columns
    after the row's valid tokens may hold ids run after it stopped: only the first ``len(prompt) + len(fed)`` real
    columns are kept)."""
    own = _own_columns(batch, i, mask, fed)
    if own is not None:
        _add(store, batch, i, fed, [(k.index_select(2, own), v.index_select(2, own)) for k, v in layers])


def keep_rows(store: KVStore, batch: Batch, picks: Sequence[tuple[int, int, Sequence[int]]], layers: KV,
              mask: torch.Tensor, release: Callable[[int], None]) -> None:
    """Store the KV of the rows of a batch that ends, layer by layer. ``picks``: (prompt row ``i``, batch row ``j``,
    the generated ids ``fed`` it ran); ``layers`` the batch's per-layer (keys, values) [B, heads, T, dim]; ``mask``
    [B, T]. Each layer of the batch is let go (``layers[l]``, and ``release(l)`` for the cache's own reference) once
    the rows' copies of it are made: the batch's KV and the stored copies are never held whole together."""
    columns = [(i, j, fed, _own_columns(batch, i, mask[j], fed)) for i, j, fed in picks]
    kept: list[KV] = [[] for _ in columns]
    for layer in range(len(layers)):
        k, v = layers[layer]
        for n, (_, j, _, own) in enumerate(columns):
            if own is not None:
                kept[n].append((k[j:j + 1].index_select(2, own), v[j:j + 1].index_select(2, own)))
        del k, v
        layers[layer] = GONE
        release(layer)
    for (i, _, fed, own), kv in zip(columns, kept, strict=True):
        if own is not None:
            _add(store, batch, i, fed, kv)


def _own_columns(batch: Batch, i: int, mask: torch.Tensor, fed: Sequence[int]) -> torch.Tensor | None:
    """The batch columns of row ``i``'s own KV (after a shared prefix it runs on), from its attention mask [T]; None
    when fewer real columns than its prompt and ``fed`` hold were run."""
    row = batch.rows[i]
    n = len(row.prompt) + len(fed)
    real = mask.nonzero().squeeze(-1)[:n]
    if len(real) < n:
        return None
    return real[len(batch.prefix.ids) if batch.prefix is not None and row.on_prefix else 0:]


def _add(store: KVStore, batch: Batch, i: int, fed: Sequence[int], kv: KV) -> None:
    row = batch.rows[i]
    store.add(Entry(row.prompt + tuple(fed), batch.prefix if row.on_prefix else None, kv))
