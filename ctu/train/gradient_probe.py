"""One micro-batch's gradients, computed as the trainer computes them, for :func:`ctu.engines.cpu.cpu_threads.check`.

Whether fewer threads change a backward pass's sums depends on this CPU's kernels (the BLAS, oneDNN's bf16 products)
and the shapes: the check runs the policy itself on a micro-batch of half the run's tokens (its activations at the
full size were the run's largest: peak RSS 3.73 GiB where the quickstart's own passes peak below 3), through the
same :func:`token_logprobs` the warm start and the updates call (train mode, their autocast), and returns the
trainable parameters' gradients without touching ``.grad``, the optimizer or the random state.

A BLAS may split some shapes' sums by thread and not others (on a 2-core AMD EPYC Zen 3, MKL's fp32 products of 5-7
and 9-11 rows differ on 1 and 2 threads, those of 12 or more do not), and a micro-batch's rows x width is whatever
its episodes' lengths make it. So the probe also runs each distinct linear layer of the model (a LoRA layer with its
adapter, the LM head) forward and backward on many token counts: every count up to ``DENSE_ROWS``, then counts
``STEP`` apart in ratio up to the micro-batch's tokens (the LM head, which sees the scored positions only, up to
``HEAD_ROWS``). It compares digests of those products (bit-exact sums of their bit patterns), not the products.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ctu.train.logprobs import body_and_head, compute_context, token_logprobs

PROBE_ROWS = 2  # rows of the micro-batch: one full, one padded (the padding path too)
PROBE_SHARE = 2  # the micro-batch has 1/PROBE_SHARE of the run's tokens (larger products run in the sweep)
SCORED = 4  # each row scores the last 1/SCORED of its tokens: an episode's reply after its prompt (the mini
# warm start scores 82-144 of ~520), so the probe's logits fit one lm_head chunk as a real micro-batch's do
DENSE_ROWS = 64  # every token count up to this one
STEP = 1.125  # then counts this ratio apart
HEAD_ROWS = 256  # the LM head's counts stop here (a micro-batch's scored positions: 44-144 of ~520 in mini's)
HEAD_STEP = 1.5


def micro_batch_gradients(model: torch.nn.Module, tokens: int, vocab: int | None = None, seed: int = 0
                          ) -> Callable[[], list[torch.Tensor]]:
    """A function returning the gradients of a summed-logprob loss over ``tokens / PROBE_SHARE`` random tokens (2
    rows, the second padded to three quarters, each scoring the last quarter of its tokens) with respect to
    ``model``'s trainable parameters, then the digests of :func:`layer_products` up to ``tokens``."""
    size = vocab or next(m for m in model.modules() if isinstance(m, torch.nn.Embedding)).num_embeddings
    width = max(4, tokens // (PROBE_ROWS * PROBE_SHARE))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, size, (PROBE_ROWS, width), generator=g)
    attn = torch.ones_like(ids)
    attn[1, (3 * width) // 4:] = 0
    needed = torch.zeros((PROBE_ROWS, width - 1))
    for row in range(PROBE_ROWS):
        real = int(attn[row].sum())
        needed[row, real - 1 - max(1, real // SCORED): real - 1] = 1
    params = [p for p in model.parameters() if p.requires_grad]
    products = layer_products(model, tokens, seed)

    def gradients() -> list[torch.Tensor]:
        device = next(model.parameters()).device
        was_training = model.training
        state = torch.get_rng_state()
        model.train()
        try:
            with torch.enable_grad():
                logp, entropy = token_logprobs(model, ids.to(device), attn.to(device), 1.0, with_entropy=True,
                                               needed=needed.to(device))
                assert entropy is not None
                weight = needed.to(device)
                loss = -(logp * weight).sum() / weight.sum() - 1e-3 * (entropy * weight).sum()
                grads = [g.detach() if g is not None else torch.zeros(0)
                         for g in torch.autograd.grad(loss, params, allow_unused=True)]
        finally:
            model.train(was_training)
            torch.set_rng_state(state)
        return grads + products()

    gradients.labels = [None] * len(params) + products.labels  # type: ignore[attr-defined]
    return gradients


def row_counts(limit: int, dense: int, step: float) -> list[int]:
    """Every count up to ``dense``, then counts ``step`` apart in ratio, and ``limit`` itself (all <= ``limit``)."""
    counts = set(range(1, min(dense, limit) + 1))
    n = dense
    while n < limit:
        n = min(limit, max(n + 1, round(n * step)))
        counts.add(n)
    return sorted(counts)


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each distinct linear layer (a LoRA layer with its adapter counts as one; same class and parameter shapes,
    dtypes and trainability: once), the LM head last."""
    _, head = body_and_head(model)
    picked: dict[tuple, torch.nn.Module] = {}
    inside: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(p + ".") for p in inside) or module is head:
            continue
        if isinstance(module, torch.nn.Linear) or isinstance(getattr(module, "base_layer", None), torch.nn.Linear):
            inside.append(name)
            key = (type(module).__name__,
                   tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in module.named_parameters()))
            picked.setdefault(key, module)
    return list(picked.values()) + ([head] if isinstance(head, torch.nn.Module) else [])


def _digest(t: torch.Tensor) -> torch.Tensor:
    """Two int64 sums of ``t``'s bit patterns (plain and position-weighted): equal only if the bits are, but for
    collisions no rounding difference makes."""
    bits = t.detach().contiguous().reshape(-1)
    ints = bits.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[bits.element_size()]).long()
    weight = torch.arange(1, ints.numel() + 1, device=ints.device) % 65521 + 1
    return torch.stack([ints.sum(), (ints * weight).sum()])


def layer_products(model: torch.nn.Module, tokens: int, seed: int = 0) -> Callable[[], list[torch.Tensor]]:
    """A function returning digests of each distinct linear layer's forward output, input gradient and trainable
    parameters' gradients on every token count :func:`row_counts` gives, in the trainer's autocast (eval mode: the
    same products without a LoRA dropout's randomness)."""
    _, head = body_and_head(model)
    g = torch.Generator().manual_seed(seed + 1)
    runs, labels = [], []
    for module in layers(model):
        counts = (row_counts(min(tokens, HEAD_ROWS), 16, HEAD_STEP) if module is head
                  else row_counts(tokens, DENSE_ROWS, STEP))
        layer: Any = getattr(module, "base_layer", module)
        weight: torch.Tensor = layer.weight
        out_features, in_features = weight.shape
        x = torch.randn((counts[-1], in_features), generator=g).to(weight.device)
        dy = torch.randn((counts[-1], out_features), generator=g).to(weight.device)
        runs.append((module, counts, x, dy))
        digests = 2 + sum(p.requires_grad for p in module.parameters())  # output, input gradient, parameters'
        labels += [("head" if module is head else "body", n) for n in counts for _ in range(digests)]

    def products() -> list[torch.Tensor]:
        was_training = model.training
        model.eval()
        out: list[torch.Tensor] = []
        try:
            with torch.enable_grad(), compute_context(model, train=True):
                for module, counts, x, dy in runs:
                    params = [p for p in module.parameters() if p.requires_grad]
                    for n in counts:
                        xn = x[:n].clone().requires_grad_(True)
                        y = module(xn)
                        grads = torch.autograd.grad(y, [xn, *params], grad_outputs=dy[:n].to(y.dtype))
                        out.extend(_digest(t) for t in (y, *grads))
        finally:
            model.train(was_training)
        return out

    products.labels = labels  # type: ignore[attr-defined]  # per digest: ("body" or "head", its token count)
    return products
