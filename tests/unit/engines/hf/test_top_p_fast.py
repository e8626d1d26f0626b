"""Top-p sampling without sorting the whole vocabulary gives the very same tokens and logprobs as sorting every row
whole (the nucleus is looked for among the top 256, then the top 4096; ties at its edge or a wider nucleus fall back
to the sort). That the draws follow the truncated distribution is tests/unit/engines/hf/test_sampling.py's."""

import pytest
import torch

from ctu.engines.base import SamplingParams
from ctu.engines.hf.sampling import sample_next


def logits_of(kind, rows=16, vocab=49152, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "peaked":  # a trained model: a few likely tokens, a long tail
        return torch.randn(rows, vocab, generator=g) * 3.0 + 12.0 * (torch.rand(rows, vocab, generator=g) > 0.9995)
    if kind == "flat":  # a random model: the nucleus holds most of the vocabulary
        return torch.randn(rows, vocab, generator=g) * 0.1
    if kind == "mixed":  # rows of both: only the flat ones need the full sort
        return torch.where(torch.arange(rows)[:, None] % 3 == 0, logits_of("flat", rows, vocab, seed),
                           logits_of("peaked", rows, vocab, seed))
    if kind == "wide":  # a nucleus of ~1000 tokens (seen in decoding the mini tasks with SmolLM2-135M at T=0.9)
        return torch.randn(rows, vocab, generator=g) * 0.5 + 9.0 * (torch.arange(vocab) < 1000)
    if kind == "wider":  # wider than the second look (4096): the full sort
        return torch.randn(rows, vocab, generator=g) * 0.5 + 9.0 * (torch.arange(vocab) < 6000)
    if kind == "ties":  # equal probabilities straddle the nucleus edge
        x = torch.full((rows, vocab), -20.0)
        x[:, :40] = 5.0
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["peaked", "flat", "mixed", "wide", "wider", "ties"])
@pytest.mark.parametrize("temperature,top_p", [(0.9, 0.95), (1.0, 0.5), (0.7, 0.999)])
@pytest.mark.parametrize("per_row", [False, True])
def test_same_tokens_and_logprobs_as_the_full_sort(kind, temperature, top_p, per_row):
    logits = logits_of(kind)
    params = SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p)
    for draw in range(3):
        def gens(draw=draw):
            if per_row:
                return [torch.Generator().manual_seed(100 * draw + r) for r in range(logits.shape[0])]
            return torch.Generator().manual_seed(draw)

        tokens, logprobs = sample_next(logits, params, gens())
        want_tokens, want_logprobs = sample_next(logits, params, gens(), looks=())  # every row sorted whole
        assert torch.equal(tokens, want_tokens)
        assert torch.equal(logprobs, want_logprobs)


def test_a_narrow_nucleus_sorts_no_full_row(monkeypatch):
    """Sorting 16 x 49152 probabilities was ~15% of a decode step (torch.profiler, SmolLM2-135M, batch 16); with
    the top 256 alone, ~21% of the rows of the mini tasks' decode (nuclei of 257-4096 tokens) were still sorted."""
    widths = []
    real_sort = torch.Tensor.sort

    def sort(self, *args, **kwargs):
        if self.shape[-1] == 49152:  # a whole row (the candidates' ids are put in order too, 256 or 4096 of them)
            widths.append(tuple(self.shape))
        return real_sort(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "sort", sort)
    params = SamplingParams(max_tokens=1, temperature=0.9, top_p=0.95)
    sample_next(logits_of("peaked"), params, torch.Generator().manual_seed(0))
    assert widths == []
    sample_next(logits_of("wide"), params, torch.Generator().manual_seed(0))
    assert widths == []  # found among the top 4096
    sample_next(logits_of("mixed"), params, torch.Generator().manual_seed(0))
    assert widths == [(6, 49152)]  # rows 0, 3, ..., 15 are flat: their nucleus is most of the vocabulary
