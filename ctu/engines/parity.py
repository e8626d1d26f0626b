"""Sampler/trainer parity after a weight sync: does the engine really use the new weights?

The engine samples ``tokens`` tokens from a fixed probe prompt with a fixed seed at the sampling
temperature (top_p = 1, so every engine's logprob is exactly ``log_softmax(logits / T)``: see
:mod:`ctu.engines.vllm` for why top-p would blur the comparison on vLLM); the trainer scores the same
ids teacher-forced; the largest per-token absolute difference is the parity number the trainer logs as
``sync/logprob_max_abs_diff`` and checks against ``engine.parity_tolerance``.

The probe prompt is longer than two of vLLM's 16-token prefix-cache blocks, so an engine that keeps
KV computed with the old weights (a missed ``reset_prefix_cache``) shows up here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import torch

from ctu.engines.base import Engine, SamplingParams

# Fixed, model-independent token ids (small ids exist in every vocabulary); 40 tokens = 2 full blocks + 8.
PROBE_PROMPT: tuple[int, ...] = tuple((7 * i + 3) % 97 + 1 for i in range(40))

ScoreFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


class ParityError(RuntimeError):
    """The engine's logprobs differ from the trainer's after a weight sync."""


def probe_parity(engine: Engine, score_fn: ScoreFn, prompt_ids: Sequence[int] = PROBE_PROMPT,
                 temperature: float = 1.0, tokens: int = 16, seed: int = 0) -> float:
    """Max |engine logprob - trainer logprob| over ``tokens`` probe tokens sampled by ``engine``.

    ``score_fn(input_ids [1, L], attention_mask [1, L], temperature)`` returns the trainer's next-token
    logprobs [1, L-1] (``ctu.train.policy.token_logprobs(model, ...)[0]``; ids arrive on CPU). Stop tokens are ignored so
    the probe always has ``tokens`` tokens (unless the engine stops early on its own EOS).
    """
    params = SamplingParams(temperature=temperature, top_p=1.0, max_tokens=tokens, seed=seed)
    prompts = [list(prompt_ids)]
    sync = getattr(engine, "generate_sync", None)  # usable from inside a running event loop
    (completion,) = (sync(prompts, params) if sync is not None else asyncio.run(engine.generate(prompts, params)))[0]
    if not completion.token_ids:
        raise ParityError("the engine returned no tokens for the parity probe")
    ids = torch.tensor([list(prompt_ids) + list(completion.token_ids)])
    with torch.no_grad():
        scored = score_fn(ids, torch.ones_like(ids), temperature)
    trainer = scored.reshape(-1)[-len(completion.token_ids):].float().cpu()
    engine_lp = torch.tensor(completion.logprobs, dtype=torch.float32)
    return float((engine_lp - trainer).abs().max())


def check_parity(diff: float, tolerance: float) -> None:
    """Raise :class:`ParityError` (one line) when ``diff`` exceeds ``tolerance``."""
    if not diff <= tolerance:  # NaN fails too
        raise ParityError(f"engine logprobs differ from the trainer's by {diff:.4g} > engine.parity_tolerance="
                          f"{tolerance:g} after sync: the engine is not using the new weights")
