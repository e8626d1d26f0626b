"""The decode path makes every tensor where its data is, never on the default device.

On a GPU the data is on ``cuda:0`` while a tensor made without ``device=`` lands on the CPU, and an op mixing
the two fails (an H200 run of the quickstart: ``index_copy_`` in top-p sampling, "index is on cpu, different
from other tensors on cuda:0"). On a CPU both are the CPU and nothing shows. Here the default device is set to
``meta`` (a device that holds no data) while the data stays on the CPU: a tensor made without naming its device
lands apart from the data, as on a GPU, and the op mixing them fails (or, for indexing, drops the write, which
the equality checks see).
"""

import pytest
import torch

from ctu.engines.base import SamplingParams
from ctu.engines.hf.sampling import sample_next
from tests.unit.engines.hf.test_engine_hf import PROMPTS, engine  # noqa: F401 - engine: the tiny-random hf engine fixture


def rows(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(4, 5000, generator=g)  # peaked: every nucleus settles among the top 256 (one look)
    if kind == "mixed":  # a flat row needs the full sort, the others settle early
        logits[1] = 0.01 * logits[1]
    return torch.softmax(logits, dim=-1)


@pytest.mark.parametrize("kind", ["peaked", "mixed"])
@pytest.mark.parametrize("top_k", [0, 50])
@pytest.mark.parametrize("per_row", [False, True])
def test_sampling_makes_its_tensors_on_the_data_device(kind, top_k, per_row):
    logits = torch.log(rows(kind))
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=top_k)

    def gens():
        return [torch.Generator().manual_seed(r) for r in range(4)] if per_row else torch.Generator().manual_seed(0)

    expected = sample_next(logits, params, gens())
    with torch.device("meta"):
        got = sample_next(logits, params, gens())
    assert got[0].device == logits.device and got[1].device == logits.device
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("params, seeds", [
    (SamplingParams(temperature=0.0, max_tokens=6), None),
    (SamplingParams(temperature=1.0, top_p=0.9, max_tokens=6, seed=3), None),
    (SamplingParams(temperature=1.3, top_p=0.95, max_tokens=6), [1, 2, 3]),  # the quickstart's sampling
])
def test_the_engine_decodes_with_no_tensor_on_the_default_device(engine, params, seeds):  # noqa: F811
    # generate_sync in this thread: torch's default device is a per-thread setting, and generate() runs it in a
    # worker thread that would not see it
    expected = engine.generate_sync(PROMPTS, params, seeds)
    with torch.device("meta"):
        got = engine.generate_sync(PROMPTS, params, seeds)
    assert got == expected
