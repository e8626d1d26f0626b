"""The hf engine's sampler: temperature, top-k and top-p pick each row's candidates (top-p among the tokens above a
probability floor first, then above a floor of the row's own), then one uniform number a row picks among them
(inverse CDF).

The nucleus is taken in one order: descending probability, equal probabilities by token id (a bf16 model's are
equal in whole runs), so which of equal tokens it keeps does not depend on a sort's implementation, and its masses
are summed in float64 (:func:`nucleus_of_sorted`). Every floor keeps the very candidates a stable sort of the whole
row keeps (``tests/unit/engines/hf/test_sampling.py``). The draw then walks the candidates in token order: a logit
that rounds otherwise on another CPU (fp32 against bf16, AVX2 against AVX-512) moves the cumulative sums by as
little, where an order by probability would reorder nearly equal tokens and change the token a uniform picks.

``torch.multinomial`` draws one exponential per vocabulary entry of every row (argmax of p / q, q ~ Exp(1)): at
batch 16 x 49,152 entries that alone was 86% of a bf16 decode step's roofline on a 2-core CPU. Here each row draws
one float64 uniform u and takes the first candidate whose float64 cumulative probability exceeds u times the
candidates' total, so candidate i is drawn with probability p_i / sum(p) of the truncated, renormalised
distribution (up to u's 2^-53 grid). A seeded run samples the same tokens again on the same machine; with one
generator per row (per-request seeds), a row's tokens do not depend on the rest of its batch. Tokens differ from
torch.multinomial's for the same seed: what is kept is the distribution, not one random stream.

The logprob of the sampled token is taken here, from the distribution it was drawn from: ``log`` of its probability
``softmax(logits / T)`` renormalised over the top-k/top-p candidates (``log p_i - log sum(p)``), ``log p_i`` when
nothing is cut (top_p = 1, no top-k: within float32's rounding of ``log_softmax``), and plain
``log_softmax(logits)`` when greedy. The trainer's importance
weights (``trainer.tis_cap``) divide by this: the policy that really sampled.
"""

from __future__ import annotations

import torch

# The nucleus is looked for among each row's tokens of probability >= 1e-4 (at most 10^4 of them): SmolLM2-135M's
# decode of the mini prompts at T 0.9, top-p 0.95 settles 86% of its rows there. A row whose nucleus reaches below
# that floor takes a floor of its own from a histogram of its mass over log-probability (eighths of a nat): the
# bucket where its mass from the top first exceeds top_p, one bucket lower.
FLOOR = 1e-4
WIDE = 2048  # candidates a row beyond which they are drawn from over the whole row rather than sorted by token id
BUCKETS_PER_NAT = 8
NATS = 104  # exp(-104) is below float32's smallest normal: what lies lower has no mass

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
    """(kept probabilities, which are dropped) of rows in nucleus order (descending probability, equal ones by token
    id): the smallest prefix whose mass reaches ``top_p`` (a token is kept when the mass before it, summed in
    float64, is at most ``top_p``)."""
    wide = sorted_probs.double()
    drop = wide.cumsum(dim=-1) - wide > top_p
    return sorted_probs.masked_fill(drop, 0.0), drop


def in_token_order(ids: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates reordered by token id: which token a uniform picks must not depend on how they were ordered."""
    ids, order = ids.sort(dim=-1)
    return ids, kept.gather(-1, order)


def above_floor(probs: torch.Tensor, top_p: float, floor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(settled [B], token ids [B, W], probabilities [B, W] in nucleus order, zero where cut or padded) of each
    row's tokens of probability at least ``floor`` (a number, or one a row): a row is settled when its nucleus ends
    among them, that is when their whole mass exceeds ``top_p`` (the first token below the floor is dropped). Every
    token below the floor is less likely than every one above it, so no tie straddles the floor, and the cumulative
    sums of a sorted prefix do not depend on what follows it: a settled row keeps the very candidates a stable sort
    of its whole row keeps (``floor`` 0.0: that sort)."""
    chosen = probs >= (floor if isinstance(floor, float) else floor[:, None])
    row, col = chosen.nonzero(as_tuple=True)  # row-major: rows ascending, tokens ascending within a row
    counts = torch.bincount(row, minlength=probs.shape[0])
    values = probs[row, col]
    # one sort for rows ascending, probability descending (the bits of a float >= 0 order as it does); a stable
    # sort keeps equal probabilities in token order
    order = ((row << 31) | (0x7FFFFFFF - values.view(torch.int32).long())).sort(stable=True).indices
    row, col, values = row[order], col[order], values[order]
    slot = torch.arange(len(row), device=probs.device) - (counts.cumsum(0) - counts)[row]
    width = int(counts.max()) + 1 if len(counts) else 1  # a zero column past every row's last chosen token
    top = probs.new_zeros(probs.shape[0], width)
    ids = torch.zeros(probs.shape[0], width, dtype=torch.long, device=probs.device)
    top[row, slot] = values
    ids[row, slot] = col
    kept, drop = nucleus_of_sorted(top, top_p)
    return drop[:, -1], ids, kept


def floors_of(logp: torch.Tensor, probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """A floor a row [n] whose tokens above hold more than ``top_p`` of its mass: a histogram of the row's mass over
    its log-probabilities (:data:`BUCKETS_PER_NAT` buckets a nat) summed from the top, the lower edge of the bucket
    where it first exceeds ``top_p`` (float rounding of the sums never decides: :func:`above_floor` checks)."""
    top = BUCKETS_PER_NAT * NATS
    bucket = logp.mul(-BUCKETS_PER_NAT).clamp_(0, top).long()
    mass = probs.new_zeros(len(probs), top + 1).scatter_add_(1, bucket, probs)
    first = (mass.cumsum(dim=-1) <= top_p).sum(dim=-1) + 1  # buckets down to the crossing one
    return (torch.exp(-first.double() / BUCKETS_PER_NAT) * (1 - 1e-5)).float()  # its lower edge, and a margin


def candidates(probs: torch.Tensor, top_p: float, top_k: int = 0, floor: float | None = FLOOR
               ) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    """Groups of rows with their candidates in token order: (row indices, token ids [n, K] or None for the whole
    vocabulary, probabilities [n, K], zero where cut).

    The nucleus order is descending probability, equal probabilities by token id. top-k keeps each row's k first;
    top-p then keeps the smallest prefix of them (all of a row, without top-k) whose mass reaches ``top_p``. Without
    top-k a row's nucleus is looked for among its tokens above ``floor``, then above a floor of its own
    (:func:`floors_of`, from the log of those rows' probabilities); a row neither
    settles (a float64 sum rounded across top_p) is sorted whole. Every floor keeps the very candidates a stable
    sort of the whole row keeps: no row's candidates depend on the others in its batch."""
    rows = torch.arange(probs.shape[0], device=probs.device)
    vocab = probs.shape[-1]
    if 0 < top_k < vocab:
        top, ids = probs.topk(top_k, dim=-1)
        ids, top = in_token_order(ids, top)  # equal probabilities by token id, whatever topk's order
        top, order = top.sort(dim=-1, descending=True, stable=True)
        kept = nucleus_of_sorted(top, top_p)[0] if top_p < 1.0 else top
        return [(rows, *in_token_order(ids.gather(-1, order), kept))]
    if top_p >= 1.0:
        return [(rows, None, probs)]
    groups: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = []
    left = probs
    if floor is not None:
        rows, left = _settle(groups, *above_floor(left, top_p, floor), rows, left)
    if len(rows):
        own = floors_of(left.log(), left, top_p)
        rows, left = _settle(groups, *above_floor(left, top_p, own), rows, left)
    if len(rows):
        rows, left = _settle(groups, *above_floor(left, top_p, 0.0), rows, left)
    if len(rows):  # a row of finite probabilities summing to ~1 settles at floor 0
        raise RuntimeError(DIVERGED)
    return groups


def _settle(groups: list, settled: torch.Tensor, ids: torch.Tensor, kept: torch.Tensor, rows: torch.Tensor,
            left: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the ``settled`` rows' candidates to ``groups``; (row indices, probabilities) of the rows left."""
    done = settled.nonzero().squeeze(-1)
    if not len(done):
        return rows, left
    ids, kept = ids[done], kept[done]
    if ids.shape[-1] > WIDE:  # spread over the whole row: a cumulative sum of it costs less than sorting the ids
        groups.append((rows[done], None, torch.zeros_like(left[done]).scatter_add_(-1, ids, kept)))  # (padding: 0)
    else:
        groups.append((rows[done], *in_token_order(ids, kept)))
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


def sample_next(logits: torch.Tensor, params, generator, floor: float | None = FLOOR
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids [B], their logprobs [B]) from last-position logits [B, V] under ``params`` (temperature, top_p,
    top_k). ``generator``: one ``torch.Generator`` for the batch, a list of one per row (per-request seeds), or
    None (torch's default)."""
    wide = logits.float()
    if params.temperature == 0:
        logp = torch.log_softmax(wide, dim=-1)
        tokens = logp.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    # a bf16 row's float copy is divided in place (the caller's fp32 logits are not written)
    scaled = wide.div_(params.temperature) if wide is not logits else wide / params.temperature
    probs = torch.softmax(scaled, dim=-1)  # the log of a row's probabilities is taken only where a floor needs it
    u = uniforms(generator, probs.shape[0], probs.device)
    tokens = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    logprobs = probs.new_empty(probs.shape[0])
    cut = params.top_p < 1.0 or 0 < getattr(params, "top_k", 0) < probs.shape[-1]
    for rows, ids, kept in candidates(probs, params.top_p, getattr(params, "top_k", 0), floor):
        pos, total = pick(kept, u[rows])
        token = pos if ids is None else ids.gather(-1, pos[:, None]).squeeze(-1)
        lp = probs[rows, token].log()
        tokens[rows] = token
        logprobs[rows] = (lp.double() - total.log()).float() if cut else lp
    return tokens, logprobs
