"""Forward passes that compute a batch's shared prefix once.

Every episode of a domain starts with the same system prompt (policy, tool list, greeting): on a CPU
most of a batch's tokens are that prefix. These functions run the common prefix once with batch 1,
repeat its KV cache across the batch, and run only each row's remainder on top of it. The results
equal a plain forward pass up to float rounding; gradients flow into the prefix pass (summed over
the rows, as the repeat's backward does).

They also compute logits only where they are needed (the loss-mask positions), instead of the full
vocabulary at every position.

Falls back to a plain forward pass when the prefix is short, when there is one row, or when the model
trains with gradient checkpointing (which recomputes layers and so cannot share a cache).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import DynamicCache

from ctu.engines.hf.hf_api import cache_of, checkpointing_enabled, with_cache
from ctu.engines.hf.kv_buffer import plain_layers

MIN_SHARED = 16  # shorter common prefixes are not worth a second pass


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix all ``rows`` share (0 for no rows)."""
    if not rows:
        return 0
    first, n = rows[0], min(len(r) for r in rows)
    for i in range(n):
        token = first[i]
        if any(r[i] != token for r in rows):
            return i
    return n


def _can_share(model: torch.nn.Module, grad: bool | None = None, training: bool | None = None) -> bool:
    """Not for gradient passes that would run a layer twice before its backward: with gradient checkpointing,
    and under FSDP2 (the first backward through a layer reshards it, and the prefix pass's backward then finds
    its saved weights freed). ``grad``/``training``: of the pass to come (default: as now)."""
    from torch.distributed.fsdp import FSDPModule

    grad = torch.is_grad_enabled() if grad is None else grad
    training = model.training if training is None else training
    if training and checkpointing_enabled(model):
        return False
    return not (grad and any(isinstance(m, FSDPModule) for m in model.modules()))


def packing_prefix(model: torch.nn.Module, rows: Sequence[Sequence[int]], masks: Sequence[Sequence[int]],
                   grad: bool, training: bool) -> int:
    """Tokens every micro-batch drawn from ``rows`` will compute once for all its rows (0 if the pass will not
    share a prefix): the common prefix of all rows, stopped before the first position any row scores
    (``masks`` are over next-token positions), as :func:`_shared_length` does for each micro-batch. Packing
    micro-batches by ``shared + rows x (longest - shared)`` tokens fits several times more rows into the same
    activation memory when most of an episode is the system prompt."""
    if len(rows) < 2 or not _can_share(model, grad, training):
        return 0
    first = min((next((i for i, m in enumerate(mask) if m), len(mask)) for mask in masks), default=0)
    shared = min(common_prefix_length(rows), first, min(len(r) for r in rows) - 1)
    return shared if shared >= MIN_SHARED else 0


def last_logits(input_ids: torch.Tensor) -> dict:
    """``logits_to_keep`` for the last position alone, as an index: the head then gets a contiguous copy of the
    hidden states there. ``logits_to_keep=1`` hands it a strided slice (every row's last position), and torch's CPU
    ``linear`` in bf16 does not fold such a 3-D input into one product: it expands the head's weight to a copy per
    row (32 rows x SmolLM2's 49,152 x 576 head: 1.7 GiB and ~5 s against 0.02 s; fp32: 0.36 against 0.10 s)."""
    return {"logits_to_keep": torch.tensor([input_ids.shape[1] - 1], device=input_ids.device)}


def _prefix_cache(model, prefix: torch.Tensor, batch: int, head: bool = True):
    """KV cache of ``prefix`` [1, P], repeated to ``batch`` rows (None if the model gives no usable cache).

    ``head=False``: ``model`` is a decoder body (no lm_head, no ``logits_to_keep``)."""
    extra = last_logits(prefix) if head else {}
    out = model(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True, **extra)
    cache = cache_of(out)
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        return None
    cache.batch_repeat_interleave(batch)
    return cache


def needed_positions(input_ids: torch.Tensor, needed: torch.Tensor | None) -> torch.Tensor:
    """Positions t (of 0..T-2) whose next token some row scores (all when ``needed`` is None)."""
    if needed is None:
        return torch.arange(input_ids.shape[1] - 1, device=input_ids.device)
    return needed.bool().any(dim=0).nonzero().squeeze(-1)


def _shared_length(model, input_ids, attention_mask, positions) -> int:
    batch = input_ids.shape[0]
    if batch == 1 or not _can_share(model):
        return 0
    lengths = attention_mask.sum(dim=-1)
    rows = [input_ids[r, : int(lengths[r])].tolist() for r in range(batch)]
    shared = min(common_prefix_length(rows), int(positions[0]), int(lengths.min()) - 1)
    return shared if shared >= MIN_SHARED else 0


def _forward_at(model, input_ids, attention_mask, positions, pick, kwargs, head=True, prefix=None):
    """``pick(model output, kept positions)`` of a forward pass over the batch, sharing its common prefix
    (``prefix``: a :class:`StepPrefix` of these rows, computed once for every micro-batch of a step)."""
    batch, width = input_ids.shape
    if prefix is not None and prefix.serves(input_ids, positions):
        shared, cache = prefix.length, prefix.cache(batch)
    else:
        shared = _shared_length(model, input_ids, attention_mask, positions)
        cache = _prefix_cache(model, input_ids[:1, :shared], batch, head) if shared else None
    if shared:
        if cache is not None:
            position_ids = torch.arange(shared, width, device=input_ids.device).expand(batch, -1)
            out = model(input_ids=input_ids[:, shared:], attention_mask=attention_mask, position_ids=position_ids,
                        **with_cache(cache), use_cache=True, **kwargs(positions - shared))
            return pick(out, positions - shared)
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs(positions))
    return pick(out, positions)


def needed_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  needed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [B, K, V], positions [K]): next-token logits at the positions where some row needs one.

    ``input_ids``/``attention_mask`` [B, T] are right-padded; ``needed`` [B, T-1] marks the positions t whose
    next token t+1 is scored (default: all). The shared prefix stops before the first needed position.
    """
    positions = needed_positions(input_ids, needed)
    if positions.numel() == 0:
        return input_ids.new_zeros((input_ids.shape[0], 0, 0), dtype=torch.float), positions
    logits = _forward_at(model, input_ids, attention_mask, positions, lambda out, kept: out.logits,
                         lambda kept: {"logits_to_keep": kept})
    return logits, positions


def needed_hidden(model: torch.nn.Module, body: torch.nn.Module, input_ids: torch.Tensor,
                  attention_mask: torch.Tensor, needed: torch.Tensor | None = None,
                  prefix: StepPrefix | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden [B, K, H], positions [K]): the last hidden states (after the final norm) of the causal LM
    ``model``'s ``body`` (its decoder, without lm_head) at the needed positions; as :func:`needed_logits`,
    whose logits are ``lm_head(hidden)``. The prefix cache is computed by ``body`` too (or is ``prefix``'s)."""
    positions = needed_positions(input_ids, needed)
    if positions.numel() == 0:
        return input_ids.new_zeros((input_ids.shape[0], 0, 0), dtype=torch.float), positions
    hidden = _forward_at(body, input_ids, attention_mask, positions,
                         lambda out, kept: out.last_hidden_state[:, kept], lambda kept: {}, head=False, prefix=prefix)
    return hidden, positions


class StepPrefix:
    """The common prefix of one optimizer step's rows, run once with gradients for all its micro-batches.

    A gradient step over rows that start with the same system prompt would run that prompt once per micro-batch
    (and once per row of a micro-batch that cannot share it). Here the decoder body runs it once, its per-layer
    keys and values are kept as leaves that each micro-batch's forward continues from (repeated to its rows), the
    micro-batches' backward passes sum their gradients into those leaves, and :meth:`backward` then carries the
    sums through the prefix pass into the weights: the gradients of running the prefix in every row, up to float
    rounding, for the prefix's compute once a step. ``cache(rows)``'s keys and values must not be written in
    place (transformers' dynamic cache appends by ``torch.cat``).
    """

    def __init__(self, body: torch.nn.Module, ids: Sequence[int], device) -> None:
        self.ids = torch.tensor([list(ids)], device=device)
        self.length = len(ids)
        out = body(input_ids=self.ids, attention_mask=torch.ones_like(self.ids), use_cache=True)
        self.outputs = [t for layer in plain_layers(cache_of(out)) or [] for t in layer]  # none: not shareable
        self.leaves = [t.detach().requires_grad_(t.requires_grad) for t in self.outputs]

    def serves(self, input_ids: torch.Tensor, positions: torch.Tensor) -> bool:
        """Whether every row of this micro-batch starts with the prefix and scores nothing inside it."""
        return (input_ids.shape[1] > self.length and int(positions[0]) >= self.length
                and bool((input_ids[:, : self.length] == self.ids).all()))

    def cache(self, rows: int):
        """A KV cache of the prefix for ``rows`` rows, over the leaves (its backward sums the rows' gradients)."""
        layers = [(self.leaves[i].expand(rows, -1, -1, -1), self.leaves[i + 1].expand(rows, -1, -1, -1))
                  for i in range(0, len(self.leaves), 2)]
        return DynamicCache(ddp_cache_data=layers)

    def backward(self) -> None:
        """The micro-batches' summed gradients, through the prefix pass into the weights (once, after every
        micro-batch's backward)."""
        pairs = [(out, leaf.grad) for out, leaf in zip(self.outputs, self.leaves, strict=True)
                 if leaf.grad is not None and out.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self.outputs, self.leaves = [], []


def prefill(model: torch.nn.Module, prompts: Sequence[Sequence[int]], pad_id: int):
    """Prefill a generation batch: (last-position logits [B, V], cache, attention mask, last positions [B, 1]).

    Rows are laid out as [shared prefix | padding | own remainder] (left padding when nothing is shared),
    with position ids that skip the padding, so decoding can go on appending to every row.
    """
    device = next(model.parameters()).device
    batch = len(prompts)
    shared = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1) if batch > 1 else 0
    if shared < MIN_SHARED:
        shared = 0
    cache = _prefix_cache(model, torch.tensor([list(prompts[0][:shared])], device=device), batch) if shared else None
    if cache is None:
        shared = 0
    width = max(len(p) for p in prompts) - shared
    ids = torch.full((batch, width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((batch, shared + width), dtype=torch.long, device=device)
    mask[:, :shared] = 1
    for row, p in enumerate(prompts):
        rest = list(p[shared:])
        ids[row, width - len(rest):] = torch.tensor(rest, dtype=torch.long, device=device)
        mask[row, shared + width - len(rest):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, **with_cache(cache), use_cache=True,
                **last_logits(ids))
    return out.logits[:, -1, :], cache_of(out), mask, positions[:, -1:]
