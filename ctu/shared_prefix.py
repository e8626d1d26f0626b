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


def _can_share(model: torch.nn.Module) -> bool:
    checkpointing = any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    return not (model.training and checkpointing)


def _prefix_cache(model, prefix: torch.Tensor, batch: int):
    """KV cache of ``prefix`` [1, P], repeated to ``batch`` rows (None if the model gives no usable cache)."""
    out = model(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True, logits_to_keep=1)
    cache = getattr(out, "past_key_values", None)
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        return None
    cache.batch_repeat_interleave(batch)
    return cache


def needed_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  needed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [B, K, V], positions [K]): next-token logits at the positions where some row needs one.

    ``input_ids``/``attention_mask`` [B, T] are right-padded; ``needed`` [B, T-1] marks the positions t whose
    next token t+1 is scored (default: all). The shared prefix stops before the first needed position.
    """
    batch, width = input_ids.shape
    device = input_ids.device
    if needed is None:
        positions = torch.arange(width - 1, device=device)
    else:
        positions = needed.bool().any(dim=0).nonzero().squeeze(-1)
    if positions.numel() == 0:
        return input_ids.new_zeros((batch, 0, 0), dtype=torch.float), positions
    lengths = attention_mask.sum(dim=-1)
    shared = 0
    if batch > 1 and _can_share(model):
        rows = [input_ids[r, : int(lengths[r])].tolist() for r in range(batch)]
        shared = min(common_prefix_length(rows), int(positions[0]), int(lengths.min()) - 1)
    if shared >= MIN_SHARED:
        cache = _prefix_cache(model, input_ids[:1, :shared], batch)
        if cache is not None:
            rest = input_ids[:, shared:]
            position_ids = torch.arange(shared, width, device=device).expand(batch, -1)
            out = model(input_ids=rest, attention_mask=attention_mask, position_ids=position_ids,
                        past_key_values=cache, use_cache=True, logits_to_keep=positions - shared)
            return out.logits, positions
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=positions)
    return out.logits, positions


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
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
                logits_to_keep=1)
    return out.logits[:, -1, :], out.past_key_values, mask, positions[:, -1:]
