"""One policy update from finished episodes: tensors, micro-batches, GRPO/PPO loss, optimizer steps.

Semantics (each a property test in tests/unit/train/test_update_semantics.py):
- the episodes are split into ``mini_batches`` optimizer steps (reshuffled each epoch with the given seed);
- within one optimizer step the loss is the configured aggregation over all of its episodes, built from
  per-token weights (:func:`ctu.rl.losses.aggregation_weights`), so neither loss, gradients nor stats
  depend on how episodes fall into micro-batches (``micro_batch_tokens`` only bounds memory);
- gradient passes run in train mode (dropout, gradient checkpointing), scoring in eval mode;
- the scheduler steps once per optimizer step that happens.

Data parallelism (``reduce``, e.g. :func:`ctu.distributed.fsdp.make_reduce`): each rank passes its slice of the
episodes and ``reduce(values, op)`` (op "sum" | "max" | "min", the same list on every rank) combines numbers
across ranks. The loss denominators (tokens, sequences, norm length) and the stats are then global, every rank
runs the same number of forwards (a rank short of micro-batches repeats one with zero weight), and the gradients
must be summed across ranks, not averaged (``shard_policy`` sets FSDP's divide factor to 1): one update over N
ranks equals the single-process update on the union of the episodes. ``reduce=None`` is the single process.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ctu.config.schema import TrainerConfig
from ctu.engines.cpu.host_memory import trim_heap
from ctu.engines.hf.shared_prefix import StepPrefix, packing_prefix
from ctu.rl.losses import aggregation_weights, kl_penalty, ppo_clip_per_token, truncated_importance_weights
from ctu.train.cast_once import cast_once
from ctu.train.logprobs import step_prefix, step_prefix_length
from ctu.train.policy import Policy, reshard, token_logprobs

Reduce = Callable[[list[float], str], list[float]]

STAT_KEYS = ("loss", "pg_loss", "kl", "entropy", "clip_fraction", "grad_norm", "updates",
             "planned_updates", "sampler_trainer_logprob_diff", "trained_tokens")



class DivergedError(ValueError):
    """A loss that is not a finite number: the weights diverged; the message names the step and the rate's key."""


def check_loss(loss: float, what: str, step: int, steps: int | None, key: str, lr: float) -> float:
    """``loss`` if finite; else stop now, naming the step and the learning rate's key (every later step would train
    on NaN, and sampling would fail on it)."""
    if not math.isfinite(loss):
        of = f" of {steps}" if steps is not None else ""
        raise DivergedError(f"{what} step {step}{of}: the loss is {loss}: the weights diverged; lower {key} ({lr:g}) "
                            "and start again (nothing after the last checkpoint is kept)")
    return loss


@dataclass
class Sample:
    """One episode as the trainer sees it: ids, what to train on, and its advantage."""

    ids: list[int]
    mask: list[int]  # over next-token positions (len(ids) - 1): 1 where the token was sampled
    sampler_logprobs: list[float]  # aligned with mask
    advantage: float
    replayed: bool = False  # a gold demonstration (trainer.sft_replay): no sampler logprobs, no mismatch to count
    # per next-token position (aligned with mask), where tokens of one episode train with different advantages
    # (step-level credit, ctu.rl.step_advantages); None: ``advantage`` everywhere
    token_advantages: list[float] | None = None


# What a data-parallel rank without episodes runs so that it takes part in every collective (zero weight).
FILLER = Sample([0, 0], [1], [0.0], 0.0)


def to_sample(prompt_ids: Sequence[int], response_ids: Sequence[int], loss_mask: Sequence[int],
              logprobs: Sequence[float], advantage: float,
              token_advantages: Sequence[float] | None = None) -> Sample:
    ids = list(prompt_ids) + list(response_ids)
    pad = [0] * (len(prompt_ids) - 1)
    per_token = None if token_advantages is None else [0.0] * len(pad) + [float(a) for a in token_advantages]
    return Sample(ids, pad + list(loss_mask), [0.0] * len(pad) + list(logprobs), float(advantage), token_advantages=per_token)


def micro_batches(lengths: Sequence[int], token_budget: int, shared: int = 0) -> list[list[int]]:
    """Pack sample indices so that the tokens a forward computes stay within ``token_budget``:
    ``shared + rows x (longest row - shared)``, where ``shared`` is a prefix common to every row that the
    forward runs once (:func:`ctu.engines.hf.shared_prefix.packing_prefix`; 0: rows x longest row).

    Rows go by length (ties in order), so each is padded only to rows of about its own length: in the order the
    episodes finished, a quickstart update padded 16% of its tokens (2.5% by length, and 13 forwards for 15).
    Which rows share a forward changes neither the loss nor the gradients (see the module doc): float rounding.
    A sample longer than the budget gets a micro-batch of its own.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):  # each row is its micro-batch's longest so far
        if current and shared + (lengths[i] - shared) * (len(current) + 1) > token_budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def pack(model: torch.nn.Module, rows: Sequence[Sample], token_budget: int, grad: bool, training: bool,
         share: bool = False) -> list[list[int]]:
    """:func:`micro_batches` of ``rows`` for a pass with (``grad``) or without gradients, in train or eval mode;
    ``share`` (``trainer.pack_shared_prefix``): count the prefix the pass will share once. Sharing packs more rows
    into a forward for the same computed tokens, but the attention over the prefix grows with the rows
    (SmolLM2-135M warm start at 1024 tokens: 2.64 -> 3.73 GiB peak RSS, 16% faster), hence off by default."""
    shared = packing_prefix(model, [s.ids for s in rows], [s.mask for s in rows], grad, training) if share else 0
    return micro_batches([len(s.ids) for s in rows], token_budget, shared)


def split_episodes(n: int, parts: int, rng: random.Random) -> list[list[int]]:
    """``n`` episode indices shuffled by ``rng`` and cut into ``min(parts, n)`` near-equal optimizer steps."""
    order = list(range(n))
    rng.shuffle(order)
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    out, start = [], 0
    for p in range(parts):
        end = start + size + (1 if p < extra else 0)
        out.append(sorted(order[start:end]))
        start = end
    return [o for o in out if o]


def planned_steps(n: int, parts: int, rng: random.Random) -> list[list[int]]:
    """Exactly ``parts`` optimizer steps' episodes: :func:`split_episodes`, then empty steps where ``n < parts``
    (an empty step on one rank still joins the others' collectives; on every rank, it only advances the
    learning-rate schedule, so the schedule counts planned steps, whatever the episodes)."""
    steps = split_episodes(n, parts, rng) if n else []
    return steps + [[] for _ in range(parts - len(steps))]


def collate(samples: Sequence[Sample], device, weights: Sequence[torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    width = max(len(s.ids) for s in samples)
    ids = torch.zeros((len(samples), width), dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width - 1))
    sampler = torch.zeros((len(samples), width - 1))
    measured = torch.zeros((len(samples), width - 1))  # the mask of the sampled rows (replayed demos: none)
    weight = torch.zeros((len(samples), width - 1))
    for row, s in enumerate(samples):  # right padding; padded positions are masked out
        ids[row, : len(s.ids)] = torch.tensor(s.ids)
        attn[row, : len(s.ids)] = 1
        mask[row, : len(s.mask)] = torch.tensor(s.mask, dtype=torch.float)
        sampler[row, : len(s.sampler_logprobs)] = torch.tensor(s.sampler_logprobs)
        if not s.replayed:
            measured[row, : len(s.mask)] = mask[row, : len(s.mask)]
        if weights is not None:
            weight[row, : len(s.mask)] = weights[row]
    adv = torch.tensor([s.advantage for s in samples])
    if any(s.token_advantages is not None for s in samples):  # per token: [batch, positions]
        adv = adv.reshape(-1, 1).expand(-1, width - 1).clone()
        for row, s in enumerate(samples):
            if s.token_advantages is not None:
                adv[row, : len(s.token_advantages)] = torch.tensor(s.token_advantages)
    return {k: v.to(device) for k, v in
            {"ids": ids, "attn": attn, "mask": mask, "sampler": sampler, "measured": measured, "adv": adv,
              "weight": weight}.items()}


@torch.no_grad()
def score_logprobs(model, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """Teacher-forced logprobs of the masked tokens, in eval mode (no dropout), without gradient, in the
    trainer's precision (``trainer.autocast``), as the gradient pass computes them."""
    was_training = model.training
    model.eval()
    try:
        return token_logprobs(model, batch["ids"], batch["attn"], temperature, needed=batch["mask"], train=True)[0]
    finally:
        model.train(was_training)


@torch.no_grad()
def sequence_kl(policy: Policy, samples: Sequence[Sample], cfg: TrainerConfig, temperature: float,
                reduce: Reduce | None = None) -> list[float]:
    """Per-episode KL to the reference, summed over its sampled tokens (for KL in the reward)."""
    out: list[float] = [0.0] * len(samples)
    rows = list(samples)
    if reduce is not None:
        total = reduce([float(len(rows))], "sum")[0]
        if total and not rows:  # no episode here: join the collectives with a weightless one
            rows = [FILLER]
    batches = pack(policy.model, rows, cfg.micro_batch_tokens, grad=False, training=False,
                   share=cfg.pack_shared_prefix) if rows else []
    for idx, dummy in _same_count(batches, reduce):
        if not samples:
            dummy = True
        batch = collate([rows[i] for i in idx], policy.device)
        current = score_logprobs(policy.model, batch, temperature)
        with policy.as_reference() as reference:
            ref = score_logprobs(reference, batch, temperature)
        per_seq = (kl_penalty(current, ref, cfg.kl_estimator) * batch["mask"]).sum(-1)
        if dummy:
            continue
        for i, value in zip(idx, per_seq.tolist(), strict=True):
            out[i] = value
    release_gathered(policy)
    return out


def release_gathered(policy: Policy) -> None:
    """After passes without backward: an FSDP2-sharded policy's units (the root's, the frozen reference's) are
    freed, as only a backward would free them (:func:`ctu.train.policy.reshard`; unsharded: nothing)."""
    reshard(policy.model, policy.reference)


def empty_stats() -> dict[str, float]:
    return dict.fromkeys(STAT_KEYS, 0.0)


def policy_update(policy: Policy, optimizer, scheduler, samples: Sequence[Sample], cfg: TrainerConfig,
                  temperature: float, seed: int = 0, reduce: Reduce | None = None) -> dict[str, float]:
    """PPO-clip/GRPO updates over ``samples``: ``ppo_epochs`` x ``mini_batches`` optimizer steps.

    Nothing to train on (no samples, or no sampled token) is a step with ``updates: 0``, not an error.
    With ``reduce`` (data parallelism, see the module doc) ``samples`` is this rank's slice.
    """
    stats = empty_stats()
    planned = cfg.ppo_epochs * max(1, cfg.mini_batches)
    stats["planned_updates"] = float(planned)
    samples = [s for s in samples if any(s.mask)]
    filler = False  # this rank has no episode while others do: it joins every collective with a weightless one
    if reduce is not None:
        total = reduce([float(len(samples))], "sum")[0]
        filler = bool(total) and not samples
        if filler:
            samples = [FILLER]
    if not samples:
        for _ in range(planned):  # the schedule counts planned steps (see planned_steps)
            scheduler.step()
        return stats
    device = policy.device
    model = policy.model
    masks = [torch.tensor(s.mask, dtype=torch.float) * (0.0 if filler else 1.0) for s in samples]
    norm_length = max(int(m.sum()) for m in masks)  # Dr.GRPO's constant: the longest response of this update
    stats["trained_tokens"] = float(sum(float(m.sum()) for m in masks))
    sampled = float(sum(float(m.sum()) for m, s in zip(masks, samples, strict=True) if not s.replayed))
    if reduce is not None:
        norm_length = int(reduce([float(norm_length)], "max")[0])
        stats["trained_tokens"], sampled = reduce([stats["trained_tokens"], sampled], "sum")
    rng = random.Random(seed)
    parts = max(1, cfg.mini_batches)  # on every rank, whatever its episodes: a rank short of them joins with fillers
    # The policy before this update (and the reference), scored once per episode in eval mode. One optimizer
    # step over every episode, without dropout and without a reference, needs no scoring pass: the old policy
    # is the one the gradient pass runs, so its logprobs (detached) are the old ones.
    use_kl = cfg.kl_coef > 0 and not cfg.kl_in_reward
    old: list[torch.Tensor] | None = None
    if not on_policy(model, cfg, parts):
        old = [torch.empty(0)] * len(samples)
    ref: list[torch.Tensor] | None = None
    if use_kl:
        ref = [torch.empty(0)] * len(samples)
    mismatch_sum = 0.0
    scores = old is not None or ref is not None  # the same on every rank (config and global counts only)
    scoring = (pack(model, samples, cfg.micro_batch_tokens, grad=False, training=False, share=cfg.pack_shared_prefix)
               if scores else [])
    for idx, dummy in _same_count(scoring, reduce) if scores else []:
        b = collate([samples[i] for i in idx], device)
        lp = score_logprobs(model, b, temperature) if old is not None else None
        rlp = None
        if ref is not None:
            with policy.as_reference() as reference:
                rlp = score_logprobs(reference, b, temperature)
        for row, i in enumerate(idx):
            n = len(samples[i].mask)
            if old is not None:
                old[i] = torch.zeros(n) if filler else lp[row, :n].cpu()  # type: ignore[index]
            if ref is not None:
                ref[i] = torch.zeros(n) if filler else rlp[row, :n].cpu()  # type: ignore[index]
        if lp is not None and not (dummy or filler):
            mismatch_sum += float(((lp - b["sampler"]).abs() * b["measured"]).sum())
    if scores:
        release_gathered(policy)
    steps = 0
    sums = dict.fromkeys(("loss", "pg_loss", "kl", "entropy", "clip_fraction", "grad_norm", "mismatch"), 0.0)
    was_training = model.training
    model.train()
    try:
        for _ in range(cfg.ppo_epochs):
            for episodes in planned_steps(len(samples), parts, rng):
                everywhere = len(episodes) if reduce is None else int(reduce([float(len(episodes))], "sum")[0])
                if everywhere:  # some rank has episodes for this step; one without joins with a weightless filler
                    none = not episodes
                    _optimizer_step(policy, optimizer, [FILLER] if none else [samples[i] for i in episodes],
                                    ([torch.zeros(1)] if none else [old[i] for i in episodes]) if old is not None else None,
                                    ([torch.zeros(1)] if none else [ref[i] for i in episodes]) if ref is not None else None,
                                    [torch.zeros(1)] if none else [masks[i] for i in episodes], norm_length, cfg,
                                    temperature, sums, reduce, filler or none)
                    steps += 1
                scheduler.step()
    finally:
        model.train(was_training)
    stats["updates"] = float(steps)
    if old is None:  # measured in the gradient pass instead (already summed over ranks)
        mismatch_sum = sums["mismatch"]
    elif reduce is not None:
        mismatch_sum = reduce([mismatch_sum], "sum")[0]
    del sums["mismatch"]
    stats["sampler_trainer_logprob_diff"] = mismatch_sum / max(1.0, sampled)
    for key, value in sums.items():
        stats[key] = value / max(1, steps)
    return stats


def on_policy(model: torch.nn.Module, cfg: TrainerConfig, parts: int) -> bool:
    """Whether the gradient pass's own logprobs are the old policy's: one epoch, one optimizer step, no dropout."""
    if cfg.ppo_epochs != 1 or parts != 1:
        return False
    return not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def _optimizer_step(policy: Policy, optimizer, samples: list[Sample], old: list[torch.Tensor] | None,
                    ref: list[torch.Tensor] | None, masks: list[torch.Tensor], norm_length: int,
                    cfg: TrainerConfig, temperature: float, sums: dict[str, float], reduce: Reduce | None = None,
                    filler: bool = False) -> None:
    """One optimizer step over these episodes; adds this step's stats to ``sums`` (``filler``: this rank only
    joins the collectives, with zero weight; ``old`` None: on policy, the old logprobs are this pass's)."""
    device = policy.device
    weights = aggregation_weights(masks, cfg.loss_aggregation, norm_length)
    tokens = float(sum(x.sum() for x in masks))
    if reduce is not None:  # the local denominators made global (weights scale by local / global)
        local = [tokens, float(sum(1 for m in masks if m.sum() > 0)), 0.0 if filler else float(len(masks))]
        total = reduce(local, "sum")
        which = {"token_mean": 0, "seq_mean_token_mean": 1, "seq_mean_token_sum_norm": 2}[cfg.loss_aggregation]
        weights = [w * (max(1.0, local[which]) / max(1.0, total[which])) for w in weights]
        tokens = total[0]
    token_share = [m / max(1.0, tokens) for m in masks]  # token means (stats, entropy)
    optimizer.zero_grad(set_to_none=True)
    step = dict.fromkeys(("loss", "pg_loss", "kl", "entropy", "clip_fraction", "mismatch"), 0.0)
    with cast_once(policy.model):  # each frozen weight cast once a step, equal activations saved once
        batches, prefix = _step_batches(policy.model, samples, cfg.micro_batch_tokens, cfg.pack_shared_prefix, reduce)
        for idx, dummy in _same_count(batches, reduce):
            zero = [0.0 * weights[i] for i in idx] if dummy or filler else None  # a repeated micro-batch: forwards, adds nothing
            b = collate([samples[i] for i in idx], device, zero or [weights[i] for i in idx])
            share = collate([samples[i] for i in idx], device, zero or [token_share[i] for i in idx])["weight"]
            width = b["mask"].shape[1]
            logp, entropy = token_logprobs(policy.model, b["ids"], b["attn"], temperature, with_entropy=True,
                                           needed=b["mask"], entropy_grad=cfg.entropy_coef > 0, prefix=prefix)
            if old is None:
                old_b = logp.detach()
                if not (dummy or filler):
                    step["mismatch"] += float(((old_b - b["sampler"]).abs() * b["measured"]).sum())
            else:
                old_b = _pad([old[i] for i in idx], width, device)
            sampler = torch.where(b["measured"] > 0, b["sampler"], old_b)  # a replayed demo's weight is 1
            tis = truncated_importance_weights(old_b, sampler, cfg.tis_cap) if cfg.tis_cap else None
            per_token, clipped = ppo_clip_per_token(logp, old_b, b["adv"], clip_low=cfg.clip_low,
                                                    clip_high=cfg.clip_high, dual_clip=cfg.dual_clip, token_weights=tis)
            pg = (per_token * b["weight"]).sum()
            loss = pg
            # every term of the loss weighs a token as the policy gradient does (stats: unweighted)
            weight = b["weight"] if tis is None else b["weight"] * tis
            ent_share = share if tis is None else share * tis
            if ref is not None:
                kl_tokens = kl_penalty(logp, _pad([ref[i] for i in idx], width, device), cfg.kl_estimator)
                loss = loss + cfg.kl_coef * (kl_tokens * weight).sum()
                step["kl"] += float((kl_tokens * b["weight"]).sum().detach())
            ent = (entropy * share).sum()
            if cfg.entropy_coef:
                loss = loss - cfg.entropy_coef * (entropy * ent_share).sum()
            loss.backward()
            trim_heap()  # this micro-batch's freed activations leave the RSS before the next one's differently sized ones
            step["loss"] += float(loss.detach())
            step["pg_loss"] += float(pg.detach())
            step["entropy"] += float(ent.detach())
            step["clip_fraction"] += float((clipped * share).sum())
        if prefix is not None:
            prefix.backward()
    norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), cfg.grad_clip)
    if hasattr(norm, "full_tensor"):  # sharded (DTensor) gradients: the global norm
        norm = norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # freed now, not at the next step: rollouts come in between
    if reduce is not None:
        step = dict(zip(step, reduce(list(step.values()), "sum"), strict=True))
    for key, value in step.items():
        sums[key] += value
    sums["grad_norm"] += float(norm)


def _step_batches(model, samples: Sequence[Sample], token_budget: int, share: bool,
                  reduce: Reduce | None) -> tuple[list[list[int]], StepPrefix | None]:
    """An optimizer step's micro-batches, and the prefix all of them continue from (in train mode, before the
    first): where every sample starts with the same prompt, it runs once a step, not once a row
    (:func:`ctu.train.logprobs.step_prefix`), and packing counts it once. Data-parallel ranks run their rows'
    prefixes as before (their micro-batches must be the same collectives whatever a rank's rows share)."""
    shared = step_prefix_length(model, [s.ids for s in samples], [s.mask for s in samples]) if reduce is None else 0
    if not shared:
        return pack(model, samples, token_budget, grad=True, training=True, share=share), None
    return micro_batches([len(s.ids) for s in samples], token_budget, shared), step_prefix(model, samples[0].ids[:shared])


def _same_count(batches: list[list[int]], reduce: Reduce | None) -> list[tuple[list[int], bool]]:
    """(micro-batch, is a repeat) pairs: with ``reduce``, as many as the rank with the most micro-batches has
    (every rank must run the same number of forwards for FSDP's collectives); repeats add nothing."""
    out = [(b, False) for b in batches]
    if reduce is not None:
        most = int(reduce([float(len(batches))], "max")[0])
        out += [(batches[0], True)] * (most - len(batches))
    return out


def _pad(rows: list[torch.Tensor], width: int, device) -> torch.Tensor:
    out = torch.zeros((len(rows), width))
    for r, row in enumerate(rows):
        out[r, : row.shape[0]] = row
    return out.to(device)


def sft_update(policy: Policy, optimizer, samples: Sequence[Sample], token_budget: int,
               reduce: Reduce | None = None, share_prefix: bool = False) -> float:
    """One supervised step (train mode): mean negative logprob of the masked (assistant) tokens.
    With ``reduce`` (data parallelism) ``samples`` is this rank's slice and the mean is over every rank's tokens."""
    optimizer.zero_grad(set_to_none=True)
    rows = list(samples)
    filler = False
    if reduce is not None and not rows:
        rows, filler = [FILLER], True
    model = policy.model
    was_training = model.training
    model.train()
    try:
        with cast_once(model):
            packed, prefix = _step_batches(model, rows, token_budget, share_prefix, reduce)
            batches = [(collate([rows[i] for i in idx], policy.device), dummy) for idx, dummy in _same_count(packed, reduce)]
            local = 0.0 if filler else sum(float(b["mask"].sum()) for b, dummy in batches if not dummy)
            total = (reduce([local], "sum")[0] if reduce is not None else local) or 1.0
            loss_sum = 0.0
            for b, dummy in batches:
                logp, _ = token_logprobs(model, b["ids"], b["attn"], needed=b["mask"], prefix=prefix)
                scale = 0.0 if dummy or filler else 1.0
                loss = -(logp * b["mask"]).sum() * scale / total
                loss.backward()
                trim_heap()
                loss_sum += float(loss.detach())
            if prefix is not None:
                prefix.backward()
    finally:
        model.train(was_training)
    torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return reduce([loss_sum], "sum")[0] if reduce is not None else loss_sum
