"""One micro-batch's gradients, computed as the trainer computes them, for :func:`ctu.engines.cpu_threads.check`.

Whether fewer threads change a backward pass's sums depends on this CPU's kernels (the BLAS, oneDNN's bf16 products)
and the shapes: the check runs the policy itself on a micro-batch of the run's size, through the same
:func:`token_logprobs` the warm start and the updates call (train mode, their autocast), and returns the trainable
parameters' gradients without touching ``.grad``, the optimizer or the random state.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ctu.train.logprobs import token_logprobs

PROBE_ROWS = 2  # rows of the micro-batch: one full, one padded (the padding path too)
SCORED = 4  # each row scores the last 1/SCORED of its tokens: an episode's reply after its prompt (the mini
# warm start scores 82-144 of ~520), so the probe's logits fit one lm_head chunk as a real micro-batch's do


def micro_batch_gradients(model: torch.nn.Module, tokens: int, vocab: int | None = None, seed: int = 0
                          ) -> Callable[[], list[torch.Tensor]]:
    """A function returning the gradients of a summed-logprob loss over ``tokens`` random tokens (2 rows, the
    second padded to three quarters, each scoring the last quarter of its tokens) with respect to ``model``'s
    trainable parameters."""
    size = vocab or next(m for m in model.modules() if isinstance(m, torch.nn.Embedding)).num_embeddings
    width = max(4, tokens // PROBE_ROWS)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, size, (PROBE_ROWS, width), generator=g)
    attn = torch.ones_like(ids)
    attn[1, (3 * width) // 4:] = 0
    needed = torch.zeros((PROBE_ROWS, width - 1))
    for row in range(PROBE_ROWS):
        real = int(attn[row].sum())
        needed[row, real - 1 - max(1, real // SCORED): real - 1] = 1
    params = [p for p in model.parameters() if p.requires_grad]

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
                return [g.detach() if g is not None else torch.zeros(0)
                        for g in torch.autograd.grad(loss, params, allow_unused=True)]
        finally:
            model.train(was_training)
            torch.set_rng_state(state)

    return gradients
