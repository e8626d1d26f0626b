"""Next-token logprobs and entropy with bounded logit memory.

The decoder body runs once (sharing the batch's common prefix, :mod:`ctu.engines.hf.shared_prefix`) and gives the
last hidden states at the scored positions; then, a chunk of positions at a time, lm_head -> float ->
/ temperature -> log_softmax -> gather (and entropy). No full fp32 [rows, positions, vocab] tensor ever
exists: at most one chunk's [rows, chunk, vocab]. With gradients enabled and several chunks each is wrapped in
``torch.utils.checkpoint``, so backward saves only the chunk's hidden states and recomputes its logits; a single
chunk keeps its log-softmax for backward instead (its backward would hold as much recomputing it, and the
gradients are the same bits), which saves an lm_head pass and a log-softmax a micro-batch.

Forwards run under the model's compute context (autocast to ``model.dtype`` over fp32 master weights,
see :func:`compute_context`), so callers need not wrap them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from ctu.engines.cpu.precision import COMPUTE_DTYPE_ATTR, TRAIN_DTYPE_ATTR, compute_context  # noqa: F401 - re-exported
from ctu.engines.hf.shared_prefix import StepPrefix, needed_hidden, needed_logits, packing_prefix

LOGIT_BUDGET = 1 << 25  # fp32 logit elements per chunk (128 MiB), unless ``chunk`` says otherwise
# a model's own budget (``trainer.logit_chunk_mib``, set by ``build_policy``), in fp32 logit elements
LOGIT_BUDGET_ATTR = "ctu_logit_budget"


def body_and_head(model: Any):
    """(decoder body, lm_head) of a Hugging Face causal LM or a PEFT model around one; (None, None) if the
    model is not of that standard shape (then the full model computes the logits)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "final_logit_softcapping", None) or getattr(base.config, "logit_scale", None):
        return None, None
    try:
        body, head = base.get_decoder(), base.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None, None
    if body is None or head is None or body is base:
        return None, None
    return body, head


def _chunk_fn(head, temperature: float, with_entropy: bool):
    def fn(hidden: torch.Tensor, targets: torch.Tensor):
        logits = hidden if head is None else head(hidden)
        logits = logits.float()
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.gather(-1, targets[..., None]).squeeze(-1)
        if not with_entropy:
            return chosen, None
        return chosen, -(logp.exp() * logp).sum(-1)
    return fn


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False, needed: torch.Tensor | None = None,
                   chunk: int | None = None, entropy_grad: bool = True, train: bool | None = None,
                   prefix: StepPrefix | None = None):
    """Logprobs of each next token (positions 1..T-1) under ``logits / temperature``; optional entropy.

    Returns (logprobs [B, T-1], entropy [B, T-1] or None). ``needed`` [B, T-1] (e.g. the loss mask) limits
    the work to the positions some row scores; positions no row scores come back as 0. ``chunk``: positions
    per lm_head chunk (default: as many as fit the model's ``trainer.logit_chunk_mib``, else ``LOGIT_BUDGET``, fp32
    logits). The entropy carries a
    gradient when gradients are enabled (``entropy_grad=False`` detaches it), so an entropy bonus in the
    loss changes the gradient. ``train``: a trainer pass, autocast to ``trainer.autocast``'s dtype when set
    (default: when gradients are enabled; the update's scoring passes say so, so its ratios compare like with like).
    ``prefix``: the optimizer step's :func:`step_prefix`, continued from instead of running the rows' shared prefix.
    """
    batch, width = input_ids.shape
    device = input_ids.device
    out = torch.zeros((batch, width - 1), device=device)
    entropy_out = torch.zeros((batch, width - 1), device=device) if with_entropy else None
    body, head = body_and_head(model)
    with compute_context(model, train=torch.is_grad_enabled() if train is None else train):
        if body is not None:
            states, positions = needed_hidden(model, body, input_ids, attention_mask, needed, prefix=prefix)
        else:  # a model of another shape: full logits at the needed positions
            states, positions = needed_logits(model, input_ids, attention_mask, needed)
        if positions.numel() == 0:
            return out, entropy_out
        vocab = head.out_features if head is not None and hasattr(head, "out_features") else states.shape[-1]
        budget = getattr(model, LOGIT_BUDGET_ATTR, None) or LOGIT_BUDGET
        size = chunk if chunk and chunk > 0 else max(1, budget // max(1, batch * vocab))
        fn = _chunk_fn(head, temperature, with_entropy)
        targets = input_ids[:, positions + 1]
        recompute = torch.is_grad_enabled() and positions.numel() > size  # several chunks: bound what is kept
        chosen_parts, entropy_parts = [], []
        for start in range(0, positions.numel(), size):
            # contiguous: torch's CPU bf16 linear expands the head's weight to a copy per row for a strided slice
            h, t = states[:, start:start + size].contiguous(), targets[:, start:start + size]
            if recompute:
                chosen, ent = checkpoint(fn, h, t, use_reentrant=False)
            else:
                chosen, ent = fn(h, t)
            chosen_parts.append(chosen)
            if with_entropy:
                entropy_parts.append(ent if entropy_grad else ent.detach())
    out = out.index_copy(1, positions, torch.cat(chosen_parts, dim=1).to(out.dtype))
    if with_entropy:
        entropy_out = entropy_out.index_copy(1, positions, torch.cat(entropy_parts, dim=1).to(out.dtype))  # type: ignore[union-attr]
    return out, entropy_out


def step_prefix_length(model: torch.nn.Module, rows, masks) -> int:
    """How many tokens an optimizer step over ``rows`` (token ids; ``masks`` over next-token positions) runs once
    for all its micro-batches (:func:`step_prefix`): their common prefix before any scored position, as
    :func:`ctu.engines.hf.shared_prefix.packing_prefix` finds it; 0 where the model cannot share one (another shape,
    one row, a short prefix, gradient checkpointing, FSDP2)."""
    if body_and_head(model)[0] is None:
        return 0
    return packing_prefix(model, rows, masks, grad=True, training=True)


def step_prefix(model: torch.nn.Module, ids) -> StepPrefix | None:
    """The prefix ``ids`` run once by the decoder body in the trainer's precision, with gradients, for every
    micro-batch of an optimizer step to continue from (:class:`ctu.engines.hf.shared_prefix.StepPrefix`; call its
    ``backward()`` after theirs); None where the model's cache is not plain per-layer tensors."""
    body, _ = body_and_head(model)
    with compute_context(model, train=True):
        prefix = StepPrefix(body, ids, next(model.parameters()).device)
    return prefix if prefix.outputs else None
