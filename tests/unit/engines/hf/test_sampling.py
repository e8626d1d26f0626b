"""The hf sampler draws from the exact truncated distribution: a chi-square test over 10^5 draws per case (all drawn
as rows of one batch) against the distribution computed here in float64 with a whole sort, for temperature, top-p,
top-k, a near-degenerate row and a flat row; the same test rejects a sampler off by one token's mass. The logprob
of each sampled token is the truncated distribution's; each row draws one number a step; seeds reproduce."""

from statistics import NormalDist

import pytest
import torch

from ctu.engines.base import SamplingParams
from ctu.engines.hf import sampling
from ctu.engines.hf.sampling import sample_next

DRAWS = 100_000
VOCAB = 32


def exact(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """The distribution a row should be sampled from, in float64: softmax(logits / T), cut to the k most likely,
    then to the smallest most-likely prefix whose mass reaches top_p, renormalised."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    top, order = probs.sort(descending=True)
    keep = torch.ones_like(top, dtype=torch.bool)
    if top_k:
        keep[top_k:] = False
    top = top * keep
    keep &= top.cumsum(-1) - top <= top_p
    kept = torch.zeros_like(probs).scatter(-1, order, top * keep)
    return kept / kept.sum()


def chi2_rejects(tokens: torch.Tensor, expected: torch.Tensor, alpha: float = 1e-6) -> bool:
    """Pearson's chi-square test of ``tokens`` against ``expected`` (bins expecting fewer than 5 draws pooled; the
    critical value by Wilson-Hilferty's approximation); any draw of a zero-probability token rejects."""
    counts = torch.bincount(tokens, minlength=expected.numel()).double()
    if bool((counts[expected == 0] > 0).any()):
        return True
    want = expected * len(tokens)
    small = (want < 5) & (expected > 0)
    obs = torch.cat([counts[want >= 5], counts[small].sum().reshape(1)])
    exp = torch.cat([want[want >= 5], want[small].sum().reshape(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = max(1, len(exp) - 1)
    z = NormalDist().inv_cdf(1 - alpha)
    return stat > df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def row(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    if kind == "peaked":  # a trained model's next token: a few likely ones, a tail
        return 2.5 * torch.randn(VOCAB, generator=g)
    if kind == "near-degenerate":  # one token at 1 - 5e-4, 31 of 1.7e-5 each: ~52 of 10^5 draws in the tail
        return torch.cat([torch.tensor([11.0]), torch.zeros(VOCAB - 1)])
    if kind == "flat":
        return torch.zeros(VOCAB)
    raise ValueError(kind)


CASES = {  # name: (row kind, temperature, top_p, top_k)
    "temperature": ("peaked", 0.7, 1.0, 0),
    "top-p": ("peaked", 1.3, 0.9, 0),
    "top-k": ("peaked", 1.3, 1.0, 12),
    "top-k and top-p": ("peaked", 2.0, 0.8, 20),
    "near-degenerate": ("near-degenerate", 1.0, 1.0, 0),
    "flat": ("flat", 1.0, 1.0, 0),
}


def draws(logits: torch.Tensor, temperature: float, top_p: float, top_k: int, seed: int = 0,
          floor=sampling.FLOOR) -> tuple[torch.Tensor, torch.Tensor]:
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    return sample_next(logits.expand(DRAWS, -1), params, torch.Generator().manual_seed(seed), floor)


@pytest.mark.parametrize("case", CASES)
def test_draws_follow_the_exact_truncated_distribution(case):
    kind, temperature, top_p, top_k = CASES[case]
    logits = row(kind)
    want = exact(logits, temperature, top_p, top_k)
    tokens, logprobs = draws(logits, temperature, top_p, top_k)
    assert not chi2_rejects(tokens, want)
    torch.testing.assert_close(logprobs.double(), want.log()[tokens], rtol=0, atol=2e-6)


@pytest.mark.parametrize("case", CASES)
def test_the_test_rejects_a_sampler_off_by_one_tokens_mass(case):
    """Draws from the case's distribution with one token's mass given to the next more likely one: the least likely
    kept token's (an off-by-one cut; without a cut, the least likely of those above 1%); in the near-degenerate
    row, where one tail token's 1.7 expected draws are beyond any test, the whole tail's to the top token (a sampler
    that never leaves the argmax)."""
    kind, temperature, top_p, top_k = CASES[case]
    want = exact(row(kind), temperature, top_p, top_k)
    order = want.argsort(descending=True)
    bad = want.clone()
    if kind == "near-degenerate":
        bad[order[0]], bad[order[1:]] = 1.0, 0.0
    else:  # without a cut, the least likely token expected in 1% of the draws
        last = int((want > (0.01 if top_p == 1 and not top_k else 0)).sum()) - 1
        source, target = order[last], order[last - 1]
        bad[target] += bad[source]
        bad[source] = 0.0
    tokens, _ = draws(bad.log().float(), 1.0, 1.0, 0)
    assert chi2_rejects(tokens, want)


def test_an_off_by_one_nucleus_edge_is_rejected(monkeypatch):
    """A nucleus cut one token early (cumulative mass > top_p, not mass before the token) fails the test."""
    logits, (_, temperature, top_p, _) = row("peaked"), CASES["top-p"]
    monkeypatch.setattr(sampling, "nucleus_of_sorted",
                        lambda p, top_p: (p.masked_fill(p.cumsum(-1) > top_p, 0.0), p.cumsum(-1) > top_p))
    tokens, _ = draws(logits, temperature, top_p, 0)
    assert chi2_rejects(tokens, exact(logits, temperature, top_p))


def test_rows_of_one_batch_settled_above_the_floor_their_own_floor_or_whole_each_follow_their_own_distribution():
    """Rows whose nucleus is found above the floor or above a floor of their own, and rows sorted whole, interleaved
    in one batch: each row's draws come from its own truncated distribution (a floor of 0.1 over 32 tokens)."""
    wide = torch.randn(VOCAB, generator=torch.Generator().manual_seed(2)) * 0.3  # a nucleus of 28 tokens
    medium = torch.cat([torch.randn(10, generator=torch.Generator().manual_seed(3)) + 6, torch.zeros(VOCAB - 10)])
    tied = torch.cat([torch.full((6,), 4.0), torch.zeros(VOCAB - 6)])  # six equal tokens of 0.154: the floor's
    kinds = [1.6 * row("peaked"), medium, wide, tied]
    probs = torch.softmax(torch.stack(kinds), -1)
    groups = sampling.candidates(probs, 0.9, floor=0.1)
    assert [rows.tolist() for rows, _, _ in groups] == [[3], [0, 1, 2]]  # above 0.1; their own floors
    assert [rows.tolist() for rows, _, _ in sampling.candidates(probs, 0.9, floor=0.0)] == [[0, 1, 2, 3]]
    logits = torch.stack(kinds).repeat(DRAWS, 1)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    tokens, logprobs = sample_next(logits, params, torch.Generator().manual_seed(0), 0.1)
    for i, x in enumerate(kinds):
        want = exact(x, 1.0, 0.9)
        assert not chi2_rejects(tokens[i::4], want), i
        torch.testing.assert_close(logprobs[i::4].double(), want.log()[tokens[i::4]], rtol=0, atol=2e-6)


def kept_sets(probs: torch.Tensor, top_p: float, floor) -> list[set[int]]:
    """Each row's candidates (token ids with mass) as ``sampling.candidates`` gives them."""
    out: list[set[int]] = [set() for _ in range(len(probs))]
    for rows, ids, kept in sampling.candidates(probs, top_p, floor=floor):
        for r, i, k in zip(rows.tolist(), (ids if ids is not None else torch.arange(probs.shape[-1]).expand_as(kept)),
                           kept, strict=True):
            out[r] = set(i[k > 0].tolist())
    return out


def test_every_floor_keeps_the_candidates_a_stable_whole_sort_keeps():
    """Over rows as a 135M model's decode gives them (49,152 entries, peaked to flat, some nuclei reaching below
    the floor), the candidates of the floor and of a row's own floor are those of a stable sort of the whole row
    (floor 0), token for token, and those of torch's stable sort of each row with float64 sums."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(24, 49152, generator=g) * torch.linspace(0.5, 4.0, 24)[:, None]
    logits[:, :30] += torch.linspace(14, 2, 30)
    probs = torch.softmax(logits, -1)
    whole = kept_sets(probs, 0.95, 0.0)
    assert kept_sets(probs, 0.95, sampling.FLOOR) == whole
    assert kept_sets(probs, 0.95, None) == whole
    top, order = probs.sort(dim=-1, descending=True, stable=True)
    wide = top.double()
    assert [set(o[c].tolist()) for o, c in zip(order, wide.cumsum(-1) - wide <= 0.95, strict=True)] == whole
    groups = sampling.candidates(probs, 0.95)
    assert len(groups) == 2 and 0 < len(groups[0][0]) < len(probs)  # some rows settle above 1e-4, others below


def test_equal_probabilities_at_the_nucleus_edge_are_kept_in_token_order():
    """Logits of four values (a bf16 model's are equal in whole runs) whose nucleus ends inside the second group:
    its first tokens by id are kept, whichever floor finds them (torch's unstable sort kept others)."""
    logits = torch.randint(0, 4, (2, 49152), generator=torch.Generator().manual_seed(0)).float() * 0.5
    probs = torch.softmax(logits, -1)
    for r, kept in enumerate(kept_sets(probs, 0.6, sampling.FLOOR)):
        first, edge = (logits[r] == 1.5).nonzero().squeeze(-1), (logits[r] == 1.0).nonzero().squeeze(-1)
        assert len(first) < len(kept) < len(first) + len(edge)
        assert kept == set(first.tolist()) | set(edge[: len(kept) - len(first)].tolist())
        for floor in (None, 0.0):
            assert kept_sets(probs[r:r + 1], 0.6, floor) == [kept]


def test_a_nucleus_below_the_floor_is_not_sorted_whole(monkeypatch):
    """A nucleus of ~20,000 tokens of 5e-5 each (below the 1e-4 floor) in 49,152: the row's own floor sorts about
    its nucleus, not the whole row (each such row was sorted whole: ~2 ms on one core)."""
    sorted_sizes = []
    real_sort = torch.Tensor.sort

    def sort(self, *args, **kwargs):
        sorted_sizes.append(self.numel())
        return real_sort(self, *args, **kwargs)

    logits = torch.randn(8, 49152, generator=torch.Generator().manual_seed(0)) * 0.3
    logits[:, 20000:] -= 8.0
    monkeypatch.setattr(torch.Tensor, "sort", sort)
    sample_next(logits, SamplingParams(temperature=1.0, top_p=0.95), torch.Generator().manual_seed(0))
    assert 0 < sum(sorted_sizes) < 8 * 25_000


@pytest.mark.parametrize("top_p, top_k", [(1.0, 0), (0.9, 0), (1.0, 12)])
def test_each_row_draws_one_number_a_step(top_p, top_k):
    """torch.multinomial drew one exponential per vocabulary entry; the sampler draws one uniform per row."""
    logits = 2.5 * torch.randn(16, 49152, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.9, top_p=top_p, top_k=top_k)
    shared = torch.Generator().manual_seed(5)
    per_row = [torch.Generator().manual_seed(r) for r in range(16)]
    sample_next(logits, params, shared)
    sample_next(logits, params, per_row)
    after = torch.Generator().manual_seed(5)
    torch.rand(16, generator=after, dtype=torch.float64)
    assert torch.equal(torch.rand(4, generator=shared), torch.rand(4, generator=after))
    for r, g in enumerate(per_row):
        after = torch.Generator().manual_seed(r)
        torch.rand(1, generator=after, dtype=torch.float64)
        assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=after))


def test_seeded_draws_are_reproducible_and_a_rows_own_seed_decides_its_token():
    logits = 2.5 * torch.randn(8, 1000, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.9, top_p=0.95)
    a = sample_next(logits, params, [torch.Generator().manual_seed(r) for r in range(8)])
    b = sample_next(logits, params, [torch.Generator().manual_seed(r) for r in range(8)])
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    alone = sample_next(logits[5:6], params, [torch.Generator().manual_seed(5)])  # the row without its batch
    assert int(alone[0]) == int(a[0][5]) and float(alone[1]) == float(a[1][5])
    shared = [sample_next(logits, params, torch.Generator().manual_seed(3))[0] for _ in range(2)]
    assert torch.equal(shared[0], shared[1])


def test_greedy_takes_the_argmax_and_its_untruncated_logprob():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
    tokens, logprobs = sample_next(logits, SamplingParams(temperature=0.0, top_p=0.5, top_k=3), None)
    assert torch.equal(tokens, logits.argmax(-1))
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1))
