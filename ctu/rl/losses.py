"""Policy-gradient loss pieces as pure tensor functions.

Shapes: per-token tensors are ``[batch, tokens]`` with a 0/1 ``mask`` of the same shape;
advantages are per sequence ``[batch]`` (broadcast over tokens) or per token ``[batch, positions]``.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: Aggregation = "token_mean",
              norm_length: int | None = None) -> torch.Tensor:
    """Reduce a per-token loss to a scalar over the masked tokens.

    token_mean: sum over all masked tokens / their count.
    seq_mean_token_mean: each sequence's masked mean, then the mean over sequences that have tokens.
    seq_mean_token_sum_norm (Dr.GRPO): each sequence's masked sum / ``norm_length`` (default: the
    padded length), then the mean over sequences.
    An all-zero mask gives 0 (with a gradient path), never NaN.
    """
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if mode == "token_mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if mode == "seq_mean_token_mean":
        counts = mask.sum(-1)
        per_seq = masked.sum(-1) / counts.clamp(min=1.0)
        has = (counts > 0).to(per_token.dtype)
        return (per_seq * has).sum() / has.sum().clamp(min=1.0)
    if mode == "seq_mean_token_sum_norm":
        length = norm_length if norm_length is not None else per_token.shape[-1]
        return (masked.sum(-1) / max(1, length)).mean() if per_token.shape[0] else masked.sum()
    raise ValueError(f"unknown loss aggregation '{mode}'")


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from sampled-token logprobs (Schulman's k1/k2/k3)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        neg = (-log_ratio).clamp(max=20.0)
        return torch.exp(neg) - neg - 1.0
    raise ValueError(f"unknown KL estimator '{estimator}'")


def truncated_importance_weights(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                                 cap: float = 2.0) -> torch.Tensor:
    """min(pi_trainer / pi_sampler, cap) per token, without gradient (sampler/trainer mismatch correction)."""
    with torch.no_grad():
        return torch.exp((trainer_logprobs - sampler_logprobs).clamp(max=20.0)).clamp(max=cap)


def ppo_clip_per_token(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, *,
                       clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
                       token_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss (negated clipped objective) and a 0/1 tensor of where clipping bound it."""
    check_clip(clip_low, clip_high, dual_clip)
    adv = (advantages if advantages.dim() == 2 else advantages.reshape(-1, 1)).to(logprobs.dtype).expand_as(logprobs)
    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)
    if token_weights is not None:
        per_token = per_token * token_weights
    return per_token, (clipped > unclipped).detach().to(logprobs.dtype)


def check_clip(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    """The clip bounds that make a PPO objective: 0 <= clip_low < 1, clip_high >= 0, dual_clip > 1."""
    if not 0 <= clip_low < 1:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")


def ppo_clip_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, *, clip_low: float = 0.2, clip_high: float = 0.2,
                  dual_clip: float | None = None, aggregation: Aggregation = "token_mean",
                  token_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip surrogate with separate low/high bounds (clip-higher) and optional dual clip.

    Returns the loss to minimise (the negated clipped objective) and metrics: the fraction of
    masked tokens clipped and the approximate KL to the old policy.
    """
    per_token, clipped = ppo_clip_per_token(logprobs, old_logprobs, advantages, clip_low=clip_low,
                                            clip_high=clip_high, dual_clip=dual_clip, token_weights=token_weights)
    loss = aggregate(per_token, mask, aggregation)
    with torch.no_grad():
        m = mask.to(logprobs.dtype)
        n = m.sum().clamp(min=1.0)
        clip_frac = (clipped * m).sum() / n
        approx_kl = (0.5 * (logprobs - old_logprobs).pow(2) * m).sum() / n
    return loss, {"clip_fraction": float(clip_frac), "approx_kl_old": float(approx_kl)}


def aggregation_weights(masks: list[torch.Tensor], mode: Aggregation = "token_mean",
                        norm_length: int | None = None) -> list[torch.Tensor]:
    """Per-token weights that turn ``aggregate`` over a whole batch into a sum over its parts.

    ``masks`` are the 0/1 loss masks of every sequence of one optimizer step (any lengths). With
    ``w = aggregation_weights(masks, mode)``, ``sum_i (per_token_i * w_i).sum()`` equals
    ``aggregate`` of the padded batch (``seq_mean_token_sum_norm`` normalises by ``norm_length``,
    default the longest mask): so a loss built from these weights does not depend on how the
    sequences are split into micro-batches.
    """
    counts = [float(m.sum()) for m in masks]
    with_tokens = sum(1 for c in counts if c > 0)
    if mode == "token_mean":
        total = sum(counts) or 1.0
        return [m / total for m in masks]
    if mode == "seq_mean_token_mean":
        return [m / (c * with_tokens) if c > 0 else m * 0.0 for m, c in zip(masks, counts, strict=True)]
    if mode == "seq_mean_token_sum_norm":
        length = norm_length if norm_length is not None else max((m.shape[-1] for m in masks), default=1)
        return [m / (max(1, length) * max(1, len(masks))) for m in masks]
    raise ValueError(f"unknown loss aggregation '{mode}'")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution given by ``logits`` [..., vocab]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
