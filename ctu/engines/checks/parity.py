"""Sampler/trainer parity after a weight sync: does the engine really use the new weights?

The engine samples ``tokens`` tokens from a fixed probe prompt with a fixed seed at the sampling
temperature (top_p = 1, so every engine's logprob is exactly ``log_softmax(logits / T)``: see
:mod:`ctu.engines.vllm.engine` for why top-p would blur the comparison on vLLM); the trainer scores the same
ids teacher-forced; the largest per-token absolute difference is the parity number the trainer logs as
``sync/logprob_max_abs_diff`` and checks against ``engine.parity_tolerance``.

The probe prompt is longer than two of vLLM's 16-token prefix-cache blocks, so an engine that keeps
KV computed with the old weights (a missed ``reset_prefix_cache``) shows up here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence

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
    the probe always has ``tokens`` tokens (unless the engine stops early on its own EOS). An engine with a
    ``prompt_logprobs(ids)`` method (a served engine) also scores the probe and its samples teacher-forced, as a
    prompt, at temperature 1; the larger difference is returned.
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
    diff = float((engine_lp - trainer).abs().max())
    prompt_logprobs = getattr(engine, "prompt_logprobs", None)  # a server scores the whole probe as a prompt too
    if prompt_logprobs is not None:
        served = torch.tensor(prompt_logprobs(ids[0].tolist()), dtype=torch.float32)
        with torch.no_grad():
            scored = score_fn(ids, torch.ones_like(ids), 1.0).reshape(-1)[-len(served):].float().cpu()
        diff = max(diff, float((served - scored).abs().max()))
    return diff


# Default tolerance (engine.parity_tolerance: null). A logit z with |z| < 2 * LOGIT_SCALE is stored in a dtype with
# e bits after the point 32 * 2^-e apart (bf16, e=7: 0.25 in [32, 64); 0.125 in [16, 32)). Two paths that round
# differently (vLLM vs the trainer's autocast, KV-cached decode vs a full forward) move the sampled token's logit
# and the log-sum-exp by up to a spacing each, more after the hidden states' own rounding: PARITY_SPACINGS
# spacings, divided by the temperature (the probe scores log_softmax(z / T)). A random Qwen-vocabulary model in
# bf16 on CPU (tests/unit/engines/checks/test_parity_bf16.py) shows 0.12-0.45 nats between two bf16 paths at T = 1.
LOGIT_SCALE = 32.0
PARITY_SPACINGS = 4
MANTISSA_BITS = {"float32": 23, "bfloat16": 7, "float16": 10}
MIN_TOLERANCE = 1e-2  # fp32: TF32 matmuls on CUDA round like fp16's 10 bits; CPU paths agree to ~1e-6


def default_parity_tolerance(dtypes: Sequence[str], temperature: float) -> float:
    """The parity tolerance for logits computed in the coarsest of ``dtypes`` (the trainer's compute dtype and
    the engine's), probed at ``temperature`` (greedy probes score plain log_softmax: T = 1)."""
    unknown = [d for d in dtypes if d not in MANTISSA_BITS]
    if unknown or not dtypes:
        raise ValueError(f"parity tolerance: unknown dtype(s) {unknown or dtypes} (known: {', '.join(MANTISSA_BITS)})")
    spacing = LOGIT_SCALE * 2.0 ** -min(MANTISSA_BITS[d] for d in dtypes)
    scale = 1.0 / temperature if 0 < temperature < 1 else 1.0
    return max(MIN_TOLERANCE, PARITY_SPACINGS * spacing * scale)


def check_parity(diff: float, tolerance: float) -> None:
    """Raise :class:`ParityError` (one line) when ``diff`` exceeds ``tolerance``."""
    if not diff <= tolerance:  # NaN fails too
        raise ParityError(f"engine logprobs differ from the trainer's by {diff:.4g} > engine.parity_tolerance="
                          f"{tolerance:g} after sync: the engine is not using the new weights")


def check_versions(engine_versions: Iterable[int | None], trainer_version: int) -> None:
    """Raise :class:`ParityError` (one line, both versions) unless every engine's stamped weight version
    (:attr:`ctu.engines.base.Engine.weights_version`) is the trainer's. A bf16 probe cannot see a stale sync at
    small learning rates (a step moves logits far less than the tolerance); the stamp can."""
    stale = [v for v in engine_versions if v != trainer_version]
    if stale:
        raise ParityError(f"engine weights are version {stale[0]}, the trainer's are version {trainer_version}: "
                          "a weight sync was skipped, dropped or did not finish")
