"""Bounded staleness: which rollouts a step may still train on (pure functions over version stamps).

Policy version ``v`` is the number of optimizer updates applied: the initial (or warm-started) weights are version
0, and step ``s`` (1-based) updates version ``s - 1`` to ``s``. With ``trainer.max_staleness = k`` step ``s`` trains
on a group only if every token the policy sampled in every episode of the group has a version ``>= s - 1 - k``
(:func:`oldest_allowed`); a token's staleness at step ``s`` is ``s - 1 - version``. Versions come from the
``token_versions`` of :class:`ctu.rollout.loop.Trajectory` (-1 where the policy sampled nothing); a sampled token
without a version (an engine that does not stamp) is of unknown age and never fresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ctu.rollout.loop import Trajectory


def oldest_allowed(step: int, max_staleness: int) -> int:
    """The oldest policy version step ``step`` may train on."""
    return step - 1 - max_staleness


def _masked_versions(versions: Sequence[int], mask: Sequence[int]) -> list[int]:
    if len(versions) != len(mask):  # sampled tokens without stamps (built before stamps existed): unknown age
        return [-1] * sum(1 for m in mask if m)
    return [v for v, m in zip(versions, mask, strict=True) if m]


def sampled_versions(trajectory: Trajectory) -> list[int]:
    """The versions of the tokens the policy sampled (loss mask 1), in order; empty when it sampled none. An
    agent's earlier samples (``extra_samples``: it rewrote its history) come first: they are trained on with the
    episode. A trajectory with sampled tokens but no stamps (built before stamps existed) gives -1 for each."""
    earlier = [v for s in getattr(trajectory, "extra_samples", None) or []
               for v in _masked_versions(getattr(s, "token_versions", ()), s.loss_mask)]
    return earlier + _masked_versions(trajectory.token_versions, trajectory.loss_mask)


def min_version(trajectories: Iterable[Trajectory]) -> int | None:
    """The oldest version among the sampled tokens of ``trajectories`` (-1: one is unknown); None: none sampled."""
    versions = [v for t in trajectories for v in sampled_versions(t)]
    if not versions:
        return None
    return -1 if any(v < 0 for v in versions) else min(versions)


def max_version(trajectories: Iterable[Trajectory]) -> int | None:
    """The newest version among the sampled tokens of ``trajectories``; None: none sampled (or none known)."""
    versions = [v for t in trajectories for v in sampled_versions(t) if v >= 0]
    return max(versions) if versions else None


def is_fresh(group: Sequence[Trajectory], step: int, max_staleness: int) -> bool:
    """Whether step ``step`` may train on ``group``: every sampled token is at most ``max_staleness`` versions
    older than the weights the step updates (a group that sampled nothing, e.g. all errored, is fresh: it carries
    no gradient and keeps its place in the step's counts)."""
    oldest = min_version(group)
    return oldest is None or (oldest >= 0 and oldest >= oldest_allowed(step, max_staleness))


def fresh_groups(groups: Sequence[Sequence[Trajectory]], step: int, max_staleness: int) -> tuple[list[int], list[int]]:
    """(indices of the groups step ``step`` may train on, indices of those too old), each in order."""
    fresh = [i for i, g in enumerate(groups) if is_fresh(g, step, max_staleness)]
    kept = set(fresh)
    return fresh, [i for i in range(len(groups)) if i not in kept]


def token_staleness(trajectories: Iterable[Trajectory], step: int) -> list[int]:
    """Per sampled token with a known version: how many versions older than step ``step``'s weights it is."""
    return [step - 1 - v for t in trajectories for v in sampled_versions(t) if v >= 0]
