"""Group-relative advantage estimators (pure functions over flat reward lists).

Episodes that sampled the same task form a group (``group_ids``). Every estimator
returns one scalar advantage per episode; the trainer broadcasts it over the
episode's generated tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence

import torch


def _groups(group_ids: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    index: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        index[g].append(i)
    return index


def grpo_advantages(rewards: Sequence[float], group_ids: Sequence[Hashable], *, normalize_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """GRPO: reward minus its group mean, divided by the group std when ``normalize_std``.

    ``normalize_std=False`` is Dr.GRPO (no std division). A group of one gets advantage 0.
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards but {len(group_ids)} group ids")
    r = torch.as_tensor(list(rewards), dtype=torch.float64)
    adv = torch.zeros_like(r)
    for idx in _groups(group_ids).values():
        values = r[idx]
        centred = values - values.mean()
        if normalize_std and len(idx) > 1:
            centred = centred / (values.std(unbiased=True) + eps)
        adv[idx] = centred if len(idx) > 1 else 0.0
    return adv.float()


def rloo_advantages(rewards: Sequence[float], group_ids: Sequence[Hashable]) -> torch.Tensor:
    """RLOO: reward minus the mean of the *other* rewards in its group (0 for a group of one)."""
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards but {len(group_ids)} group ids")
    r = torch.as_tensor(list(rewards), dtype=torch.float64)
    adv = torch.zeros_like(r)
    for idx in _groups(group_ids).values():
        n = len(idx)
        if n > 1:
            values = r[idx]
            adv[idx] = values - (values.sum() - values) / (n - 1)
    return adv.float()


def batch_advantages(rewards: Sequence[float], *, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++-style: reward minus the *batch* mean, divided by the batch std (one baseline for every episode).

    Unlike a group baseline, a group whose samples all succeed still gets a positive advantage when the batch
    does worse on average, so behaviour the policy already gets right is reinforced, not ignored (GRPO gives it
    0). A batch of one, or of equal rewards, gets 0.
    """
    r = torch.as_tensor(list(rewards), dtype=torch.float64)
    if len(r) < 2:
        return torch.zeros(len(r))
    return ((r - r.mean()) / (r.std(unbiased=True) + eps)).float()


def class_baseline_advantages(rewards: Sequence[float], classes: Sequence[Hashable], *,
                              eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with a baseline per class of tasks (``trainer.baseline_by``): reward minus the mean reward of
    the batch's episodes of the same class (e.g. the request's kind), divided by the batch std of those centred
    values. The batch baseline's scale, but no contrast across classes: an easy kind's successes are not pushed up
    because a hard kind failed, so a step's direction no longer depends on the batch's mix of kinds. The baseline
    depends on the task alone, so the gradient stays unbiased. A class of one, or of equal rewards, gets 0."""
    if len(rewards) != len(classes):
        raise ValueError(f"{len(rewards)} rewards but {len(classes)} classes")
    r = torch.as_tensor(list(rewards), dtype=torch.float64)
    centred = torch.zeros_like(r)
    for idx in _groups(classes).values():
        if len(idx) > 1:
            centred[idx] = r[idx] - r[idx].mean()
    if len(r) < 2 or not centred.abs().max() > 0:
        return torch.zeros(len(r))
    return (centred / (centred.std(unbiased=True) + eps)).float()


SUCCESS = 1.0 - 1e-6  # rft: the full reward


def success_advantages(rewards: Sequence[float]) -> torch.Tensor:
    """RFT (rejection-sampling fine-tuning, expert iteration): 1 for an episode that reached the full reward, 0
    otherwise. The update then imitates the policy's own successes (the loss is the mean over their tokens) and
    pushes nothing down: no baseline, so a batch where writes fail more often than reports cannot teach "never
    write", and no group is needed. :func:`scored_advantages` leaves the 0s out of the update altogether."""
    return torch.tensor([1.0 if r >= SUCCESS else 0.0 for r in rewards])


def greedy_baseline_advantages(rewards: Sequence[float], baselines: Sequence[float]) -> torch.Tensor:
    """ReMax (Li et al., 2023; self-critical training before it): each episode's reward minus the reward of a
    greedy episode of the same task by the same policy. An episode that did what the greedy policy does gets 0,
    so a step pushes only where a sample did better (+) or worse (-) than what evaluation would see, on that
    task: a batch baseline instead gives every episode a full-size push whose sum over task kinds is decided by
    the batch's mix of kinds, and a group baseline needs several samples of each task."""
    if len(rewards) != len(baselines):
        raise ValueError(f"{len(rewards)} rewards but {len(baselines)} baselines")
    return (torch.as_tensor(list(rewards), dtype=torch.float64)
            - torch.as_tensor(list(baselines), dtype=torch.float64)).float()


def informative_groups(rewards: Sequence[float], group_ids: Sequence[Hashable], tol: float = 1e-9) -> list[int]:
    """Dynamic sampling: indices of episodes whose group's rewards are not all equal (in order)."""
    keep = set()
    for idx in _groups(group_ids).values():
        values = [rewards[i] for i in idx]
        if max(values) - min(values) > tol:
            keep.update(idx)
    return sorted(keep)


Estimator = Callable[[Sequence[float], Sequence[Hashable]], torch.Tensor]
ESTIMATORS: dict[str, Estimator] = {
    "grpo": lambda r, g: grpo_advantages(r, g, normalize_std=True),
    "dr_grpo": lambda r, g: grpo_advantages(r, g, normalize_std=False),
    "rloo": rloo_advantages,
    "reinforce_pp": lambda r, g: batch_advantages(r),
    "rft": lambda r, g: success_advantages(r),
}
GROUP_FREE = {"reinforce_pp", "rft", "remax"}  # estimators that do not need a group of samples of the same task
BASELINED = {"remax"}  # estimators whose baseline is a greedy episode of each task (``baselines``)


def compute_advantages(name: str, rewards: Sequence[float], group_ids: Sequence[Hashable]) -> torch.Tensor:
    try:
        return ESTIMATORS[name](rewards, group_ids)
    except KeyError:
        raise ValueError(f"unknown advantage estimator '{name}' (known: {', '.join(ESTIMATORS)})") from None


def scored_advantages(name: str, rewards: Sequence[float], group_ids: Sequence[Hashable],
                      errored: Sequence[bool], baselines: Sequence[float | None] | None = None,
                      classes: Sequence[Hashable] | None = None) -> dict[int, float]:
    """Advantages of the episodes that can be trained on: {episode index: advantage}.

    Errored episodes are left out *before* the group statistics (they have no reward, not reward 0), and a
    group with fewer than two scored episodes has no baseline, so it contributes nothing (except under a batch
    baseline, which every scored episode shares). Under ``rft`` only the successes are returned; under ``remax``
    only the episodes whose reward differs from their greedy baseline (``baselines[i]``; an episode whose greedy
    twin errored has none and is left out). With ``classes`` (``trainer.baseline_by``), ``reinforce_pp`` takes
    its baseline per class (:func:`class_baseline_advantages`).
    """
    if not len(rewards) == len(group_ids) == len(errored):
        raise ValueError(f"{len(rewards)} rewards, {len(group_ids)} group ids, {len(errored)} error flags")
    scored = [i for i, bad in enumerate(errored) if not bad]
    if name in BASELINED:
        if baselines is None or len(baselines) != len(rewards):
            raise ValueError(f"{name}: needs one greedy baseline per episode, got "
                             f"{'none' if baselines is None else len(baselines)} for {len(rewards)} episodes")
        usable = [i for i in scored if baselines[i] is not None]
        adv = greedy_baseline_advantages([rewards[i] for i in usable], [b for i in usable if (b := baselines[i]) is not None])
        return {i: a for i, a in zip(usable, adv.tolist(), strict=True) if a != 0.0}
    sizes: dict[Hashable, int] = defaultdict(int)
    for i in scored:
        sizes[group_ids[i]] += 1
    usable = scored if name in GROUP_FREE else [i for i in scored if sizes[group_ids[i]] >= 2]
    if not usable:
        return {}
    if classes is not None and name == "reinforce_pp":
        adv = class_baseline_advantages([rewards[i] for i in usable], [classes[i] for i in usable])
        return dict(zip(usable, adv.tolist(), strict=True))
    adv = compute_advantages(name, [rewards[i] for i in usable], [group_ids[i] for i in usable])
    out = dict(zip(usable, adv.tolist(), strict=True))
    return {i: a for i, a in out.items() if a != 0.0} if name == "rft" else out
