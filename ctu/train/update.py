"""One policy update from finished episodes: tensors, micro-batches, GRPO/PPO loss, optimizer steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ctu.config import TrainerConfig
from ctu.rl.losses import aggregate, kl_penalty, ppo_clip_loss, truncated_importance_weights
from ctu.train.policy import Policy, token_logprobs


@dataclass
class Sample:
    """One episode as the trainer sees it: ids, what to train on, and its advantage."""

    ids: list[int]
    mask: list[int]  # over next-token positions (len(ids) - 1): 1 where the token was sampled
    sampler_logprobs: list[float]  # aligned with mask
    advantage: float


def to_sample(prompt_ids: Sequence[int], response_ids: Sequence[int], loss_mask: Sequence[int],
              logprobs: Sequence[float], advantage: float) -> Sample:
    ids = list(prompt_ids) + list(response_ids)
    pad = [0] * (len(prompt_ids) - 1)
    return Sample(ids, pad + list(loss_mask), [0.0] * len(pad) + list(logprobs), float(advantage))


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Pack sample indices (in order) so that rows x longest row stays within ``token_budget``.

    A sample longer than the budget gets a micro-batch of its own.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and max(longest, n) * (len(current) + 1) > token_budget:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def collate(samples: Sequence[Sample], device) -> dict[str, torch.Tensor]:
    width = max(len(s.ids) for s in samples)
    ids = torch.zeros((len(samples), width), dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width - 1))
    sampler = torch.zeros((len(samples), width - 1))
    for row, s in enumerate(samples):  # right padding; padded positions are masked out
        ids[row, : len(s.ids)] = torch.tensor(s.ids)
        attn[row, : len(s.ids)] = 1
        mask[row, : len(s.mask)] = torch.tensor(s.mask, dtype=torch.float)
        sampler[row, : len(s.sampler_logprobs)] = torch.tensor(s.sampler_logprobs)
    adv = torch.tensor([s.advantage for s in samples])
    return {k: v.to(device) for k, v in
            {"ids": ids, "attn": attn, "mask": mask, "sampler": sampler, "adv": adv}.items()}


@torch.no_grad()
def score_logprobs(model, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    return token_logprobs(model, batch["ids"], batch["attn"], temperature, needed=batch["mask"])[0]


@torch.no_grad()
def sequence_kl(policy: Policy, samples: Sequence[Sample], cfg: TrainerConfig, temperature: float) -> list[float]:
    """Per-episode KL to the reference, summed over its sampled tokens (for KL in the reward)."""
    out: list[float] = [0.0] * len(samples)
    model = policy.model
    was_training = model.training
    model.eval()
    for idx in micro_batches([len(s.ids) for s in samples], cfg.micro_batch_tokens):
        batch = collate([samples[i] for i in idx], policy.device)
        current = score_logprobs(model, batch, temperature)
        with policy.as_reference() as reference:
            ref = score_logprobs(reference, batch, temperature)
        per_seq = (kl_penalty(current, ref, cfg.kl_estimator) * batch["mask"]).sum(-1)
        for i, value in zip(idx, per_seq.tolist(), strict=True):
            out[i] = value
    model.train(was_training)
    return out


def policy_update(policy: Policy, optimizer, scheduler, samples: Sequence[Sample], cfg: TrainerConfig,
                  temperature: float) -> dict[str, float]:
    """PPO-clip/GRPO updates over ``samples``: ``ppo_epochs`` x ``mini_batches`` optimizer steps."""
    if not samples:
        return {"updates": 0.0}
    device = policy.device
    budget = cfg.micro_batch_tokens
    batches = [collate([samples[i] for i in idx], device) for idx in micro_batches([len(s.ids) for s in samples], budget)]
    model = policy.model
    was_training = model.training
    model.eval()
    old = [score_logprobs(model, b, temperature) for b in batches]  # the policy before this update
    ref = None
    if cfg.kl_coef > 0 and not cfg.kl_in_reward:
        with policy.as_reference() as reference:
            ref = [score_logprobs(reference, b, temperature) for b in batches]
    model.train(was_training)
    mismatch = [((o - b["sampler"]).abs() * b["mask"]).sum() / b["mask"].sum().clamp(min=1)
                for o, b in zip(old, batches, strict=True)]
    stats = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0,
             "updates": 0.0, "sampler_trainer_logprob_diff": float(torch.stack(mismatch).mean())}
    per_mini = max(1, len(batches) // cfg.mini_batches)
    groups = [list(range(i, min(len(batches), i + per_mini))) for i in range(0, len(batches), per_mini)]
    for _ in range(cfg.ppo_epochs):
        for group in groups:
            optimizer.zero_grad(set_to_none=True)
            total = sum(float(batches[j]["mask"].sum()) for j in group) or 1.0
            for j in group:
                b = batches[j]
                weight = float(b["mask"].sum()) / total
                logp, entropy = token_logprobs(model, b["ids"], b["attn"], temperature, with_entropy=True,
                                               needed=b["mask"])
                tis = truncated_importance_weights(old[j], b["sampler"], cfg.tis_cap) if cfg.tis_cap else None
                pg, info = ppo_clip_loss(logp, old[j], b["adv"], b["mask"], clip_low=cfg.clip_low,
                                         clip_high=cfg.clip_high, dual_clip=cfg.dual_clip,
                                         aggregation=cfg.loss_aggregation, token_weights=tis)
                loss = pg
                if ref is not None:
                    kl = aggregate(kl_penalty(logp, ref[j], cfg.kl_estimator), b["mask"], cfg.loss_aggregation)
                    loss = loss + cfg.kl_coef * kl
                    stats["kl"] += float(kl.detach()) * weight / len(groups) / cfg.ppo_epochs
                ent = aggregate(entropy, b["mask"], "token_mean")
                if cfg.entropy_coef:
                    loss = loss - cfg.entropy_coef * ent
                (loss * weight).backward()
                scale = weight / len(groups) / cfg.ppo_epochs
                stats["loss"] += float(loss.detach()) * scale
                stats["pg_loss"] += float(pg.detach()) * scale
                stats["entropy"] += float(ent.detach()) * scale
                stats["clip_fraction"] += info["clip_fraction"] * scale
            norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), cfg.grad_clip)
            stats["grad_norm"] += float(norm) / len(groups) / cfg.ppo_epochs
            optimizer.step()
            scheduler.step()
            stats["updates"] += 1
    return stats


def sft_update(policy: Policy, optimizer, samples: Sequence[Sample], token_budget: int) -> float:
    """One supervised step: mean negative logprob of the masked (assistant) tokens."""
    optimizer.zero_grad(set_to_none=True)
    batches = [collate([samples[i] for i in idx], policy.device)
               for idx in micro_batches([len(s.ids) for s in samples], token_budget)]
    total = sum(float(b["mask"].sum()) for b in batches) or 1.0
    loss_sum = 0.0
    for b in batches:
        logp, _ = token_logprobs(policy.model, b["ids"], b["attn"], needed=b["mask"])
        loss = -(logp * b["mask"]).sum() / total
        loss.backward()
        loss_sum += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
    optimizer.step()
    return loss_sum
