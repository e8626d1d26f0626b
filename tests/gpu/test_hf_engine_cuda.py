"""The hf engine in bf16 on CUDA: what it samples and the logprobs it reports follow its weights (a model with
weights 15x HF's default scale, so its logprobs spread over many nats and another model's differ by more than
the bf16 tolerance), and a weight update changes both."""

import asyncio

import pytest
import torch

pytestmark = pytest.mark.gpu

PROMPTS = [[1, 520, 33, 88, 4000, 17], [1, 9, 2600]]


def teacher_forced(model, prompt, completion, temperature):
    from ctu.train.logprobs import token_logprobs

    ids = torch.tensor([prompt + list(completion.token_ids)], device="cuda")
    with torch.no_grad():
        scored = token_logprobs(model, ids, torch.ones_like(ids), temperature)[0]
    return scored[0, -len(completion.token_ids):].float().cpu()


def greedy_next(model, prompt, completion):
    ids = torch.tensor([prompt + list(completion.token_ids)], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    top2 = logits.topk(2, dim=-1).values
    return logits.argmax(-1).cpu(), (top2[:, 0] - top2[:, 1]).cpu()


def check_follows_weights(engine, model, tolerance):
    from ctu.engines.base import SamplingParams

    greedy = asyncio.run(engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8)))
    # top_p < 1: the nucleus's row index must be made on the GPU (index_copy_ failed on cuda:0 with a CPU index);
    # the logprobs are taken before the truncation, so the teacher-forced check below holds as without it
    sampled = asyncio.run(engine.generate(PROMPTS, SamplingParams(temperature=0.7, top_p=0.95, max_tokens=8, n=2,
                                                                  seed=0)))
    for prompt, (c,) in zip(PROMPTS, greedy, strict=True):
        ref = teacher_forced(model, prompt, c, 1.0)
        assert (torch.tensor(c.logprobs) - ref).abs().max() <= tolerance
        best, margin = greedy_next(model, prompt, c)
        clear = margin > 0.5  # bf16 rounding may swap near-ties only
        assert torch.equal(torch.tensor(c.token_ids)[clear], best[clear])
    spread = []
    for prompt, group in zip(PROMPTS, sampled, strict=True):
        for c in group:
            ref = teacher_forced(model, prompt, c, 0.7)
            assert (torch.tensor(c.logprobs) - ref).abs().max() <= tolerance / 0.7
            spread.append(float(ref.max() - ref.min()))
    assert max(spread) > 4 * tolerance  # the logprobs depend on the weights, not a near-uniform model's -log V
    return [c.token_ids for (c,) in greedy]


def test_bf16_generation_on_cuda_follows_the_weights(tmp_path):
    from ctu.engines.checks.parity import default_parity_tolerance
    from ctu.engines.hf.engine import HFEngine
    from ctu.engines.hf.models import load_model, load_tokenizer
    from tests.support.models import save_random_model

    paths = [save_random_model(tmp_path / f"m{seed}", arch="qwen2", layers=2, hidden=128, seed=seed,
                               initializer_range=0.3) for seed in (0, 1)]
    model = load_model(paths[0], device="cuda")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    engine = HFEngine(model, load_tokenizer(paths[0]))
    tolerance = default_parity_tolerance(["bfloat16"], 1.0)
    before = check_follows_weights(engine, model, tolerance)

    other = load_model(paths[1], device="cuda")
    engine.update_weights(((n, p.detach()) for n, p in other.named_parameters()), version=1)
    assert engine.weights_version == 1
    after = check_follows_weights(engine, model, tolerance)  # the engine's model now holds the other weights
    assert after != before
