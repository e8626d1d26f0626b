"""The hf engine's sampler: temperature, top-k and top-p pick each row's candidates (top-p among the tokens above a
probability floor first, then the largest few, a whole sort last), then one uniform number a row picks among them
(inverse CDF).

``torch.multinomial`` draws one exponential per vocabulary entry of every row (argmax of p / q, q ~ Exp(1)): at
batch 16 x 49,152 entries that alone was 86% of a bf16 decode step's roofline on a 2-core CPU. Here each row draws
one float64 uniform u and takes the first candidate whose float64 cumulative probability exceeds u times the
candidates' total, so candidate i is drawn with probability p_i / sum(p) of the truncated, renormalised
distribution (up to u's 2^-53 grid). A seeded run samples the same tokens again on the same machine; with one
generator per row (per-request seeds), a row's tokens do not depend on the rest of its batch. Tokens differ from
torch.multinomial's for the same seed: what is kept is the distribution, not one random stream.

The logprob of the sampled token is taken here, from the distribution it was drawn from: ``log_softmax(logits /
T)`` renormalised over the top-k/top-p candidates (``log p_i - log sum(p)``), exactly ``log_softmax(logits / T)``
when nothing is cut (top_p = 1, no top-k), and plain ``log_softmax(logits)`` when greedy. The trainer's importance
weights (``trainer.tis_cap``) divide by this: the policy that really sampled.
"""

from __future__ import annotations

import torch

# The nucleus is looked for among each row's tokens of probability >= 1e-4 (at most 10^4 of them), then among its
# 256 and 4096 largest probabilities, before sorting the whole row. SmolLM2-135M's first 24 decode steps of 16 mini
# prompts at T 0.9, top-p 0.95 (a 2-core Zen 4, one thread): 89% of the rows settle above the floor (60% in the top
# 256 without it), and sampling takes 13.6 ms a step instead of 33.5; at T 1.3, 95% of that base model's rows are
# sorted whole either way (~60 ms). A second floor of 1e-6 settled the rest but sorted flat rows slower than whole.
FLOORS = (1e-4,)
LOOKS = (256, 4096)

DIVERGED = ("the model's next-token probabilities are not finite numbers (NaN or inf): its weights diverged; in "
            "training, lower trainer.lr (or trainer.sft_lr for the warm start) and start again")


def uniforms(generator, rows: int, device: torch.device) -> torch.Tensor:
    """One float64 uniform in [0, 1) per row: from the row's own generator (a list), the batch's, or torch's."""
    if isinstance(generator, list):
        if len(generator) != rows:
            raise ValueError(f"{len(generator)} generators for {rows} rows")
        return torch.cat([torch.rand(1, generator=g, dtype=torch.float64, device=device) for g in generator])
    return torch.rand(rows, generator=generator, dtype=torch.float64, device=device)


def nucleus_of_sorted(sorted_probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept probabilities, which are dropped) of rows sorted in descending order: the smallest prefix whose mass
    reaches ``top_p`` (a token is kept when the mass before it is at most ``top_p``)."""
    drop = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p
    return sorted_probs.masked_fill(drop, 0.0), drop


def in_token_order(ids: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates reordered by token id: which token a uniform picks must not depend on how torch.topk or sort
    ordered equal probabilities."""
    ids, order = ids.sort(dim=-1)
    return ids, kept.gather(-1, order)


def above_floor(probs: torch.Tensor, top_p: float, floor: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(settled [B], token ids [B, W], probabilities [B, W] in descending order, zero where cut or padded) of each
    row's tokens of probability at least ``floor``: a row is settled when its nucleus ends among them, that is when
    their whole mass exceeds ``top_p`` (the first token below the floor is dropped). Every token below the floor is
    less likely than every one above it, so no tie straddles the floor, and the cumulative sums of a sorted prefix
    do not depend on what follows it: a settled row keeps the very candidates a sort of its whole row keeps. Equal
    probabilities stay in token order (stable sorts). At most 1 / ``floor`` tokens a row are sorted."""
    chosen = probs >= floor
    counts = chosen.sum(dim=-1)
    row, col = chosen.nonzero(as_tuple=True)  # row-major: rows ascending, tokens ascending within a row
    values = probs[row, col]
    order = values.sort(descending=True, stable=True).indices
    order = order[row[order].sort(stable=True).indices]  # each row's own, still in descending probability
    row, col, values = row[order], col[order], values[order]
    slot = torch.arange(len(row), device=probs.device) - (counts.cumsum(0) - counts)[row]
    width = int(counts.max()) + 1 if len(counts) else 1  # a zero column past every row's last chosen token
    top = probs.new_zeros(probs.shape[0], width)
    ids = torch.zeros(probs.shape[0], width, dtype=torch.long, device=probs.device)
    top[row, slot] = values
    ids[row, slot] = col
    kept, drop = nucleus_of_sorted(top, top_p)
    return drop[:, -1], ids, kept


def candidates(probs: torch.Tensor, top_p: float, top_k: int = 0, looks: tuple[int, ...] = LOOKS,
               floors: tuple[float, ...] = FLOORS) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    """Groups of rows with their candidates in token order: (row indices, token ids [n, K] or None for the whole
    vocabulary, probabilities [n, K], zero where cut).

    top-k keeps each row's k largest; top-p then keeps the smallest prefix of them (all of a row, sorted, without
    top-k) whose mass reaches ``top_p``. Without top-k a row's nucleus is looked for among its tokens above each of
    ``floors`` (:func:`above_floor`), then among its ``looks`` largest probabilities (torch.topk), and only a row
    whose nucleus is wider than every look, or whose edge equal probabilities straddle, is sorted whole: the
    cumulative sums of a sorted prefix do not depend on what follows it, so every floor and look keeps the very
    candidates the whole sort keeps."""
    rows = torch.arange(probs.shape[0], device=probs.device)
    vocab = probs.shape[-1]
    if 0 < top_k < vocab:
        top, ids = probs.topk(top_k, dim=-1)
        return [(rows, *in_token_order(ids, nucleus_of_sorted(top, top_p)[0] if top_p < 1.0 else top))]
    if top_p >= 1.0:
        return [(rows, None, probs)]
    groups: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = []
    left = probs
    for floor in floors:
        if not len(rows):
            break
        settled, ids, kept = above_floor(left, top_p, floor)
        rows, left = _settle(groups, settled, rows, ids, kept, left)
    for first in looks:
        if vocab <= first or not len(rows):
            break
        top, ids = left.topk(first, dim=-1)
        kept, drop = nucleus_of_sorted(top, top_p)
        edge = drop.int().argmax(dim=-1, keepdim=True)  # the first dropped position of each row
        tied = (top.gather(-1, edge) == top.gather(-1, (edge - 1).clamp(min=0))).squeeze(-1)
        settled = drop[:, -1] & ~tied  # the nucleus ends inside this look, and no tie decides its edge
        rows, left = _settle(groups, settled, rows, ids, kept, left)
    if len(rows):
        top, ids = left.sort(dim=-1, descending=True)  # only these rows are sorted whole
        groups.append((rows, None, torch.zeros_like(top).scatter(-1, ids, nucleus_of_sorted(top, top_p)[0])))
    return groups


def _settle(groups: list, settled: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, kept: torch.Tensor,
            left: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the ``settled`` rows' candidates to ``groups``; (row indices, probabilities) of the rows left."""
    done = settled.nonzero().squeeze(-1)
    if len(done):
        groups.append((rows[done], *in_token_order(ids[done], kept[done])))
    wider = (~settled).nonzero().squeeze(-1)
    return rows[wider], left[wider]


def pick(kept: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(position [n], the candidates' total mass [n], float64) of one inverse-CDF draw per row: the first position
    whose float64 cumulative sum exceeds ``u`` times the row's total. A position of zero probability is never
    drawn; the total is checked finite and positive (a diverged model's is not)."""
    cum = kept.double().cumsum(dim=-1)
    total = cum[:, -1]
    if not bool(torch.isfinite(total).all() and (total > 0).all()):
        raise RuntimeError(DIVERGED)
    pos = torch.searchsorted(cum, (u * total)[:, None], right=True).squeeze(-1)
    beyond = pos >= kept.shape[-1]  # u * total rounded up to the total itself: the last candidate with mass
    if bool(beyond.any()):
        last = kept.shape[-1] - 1 - (kept[beyond] > 0).flip(-1).int().argmax(dim=-1)
        pos = pos.masked_scatter(beyond, last)
    return pos, total


def sample_next(logits: torch.Tensor, params, generator, looks: tuple[int, ...] = LOOKS,
                floors: tuple[float, ...] = FLOORS) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids [B], their logprobs [B]) from last-position logits [B, V] under ``params`` (temperature, top_p,
    top_k). ``generator``: one ``torch.Generator`` for the batch, a list of one per row (per-request seeds), or
    None (torch's default)."""
    logits = logits.float()
    if params.temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logp.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    u = uniforms(generator, logits.shape[0], logits.device)
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    logprobs = logp.new_empty(logits.shape[0])
    cut = params.top_p < 1.0 or 0 < getattr(params, "top_k", 0) < logits.shape[-1]
    for rows, ids, kept in candidates(logp.exp(), params.top_p, getattr(params, "top_k", 0), looks, floors):
        pos, total = pick(kept, u[rows])
        token = pos if ids is None else ids.gather(-1, pos[:, None]).squeeze(-1)
        lp = logp[rows, token]
        tokens[rows] = token
        logprobs[rows] = (lp.double() - total.log()).float() if cut else lp
    return tokens, logprobs
