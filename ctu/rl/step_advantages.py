"""Step-level advantages (GiGPO's anchor states, Tree-GRPO's siblings) as pure functions.

An episode's turns are (state, action) pairs: the state is the token ids before the turn's sampled tokens, the
action the sampled ids. Episodes of one task group that reach a token-identical state form a step group there
(GiGPO's anchor state, at no extra sampling); branched rollouts make such groups on purpose (siblings forked from
one state share its tokens). At a state ``s`` reached by ``n >= 2`` episodes, the action ``a`` taken there gets

    A_step(s, a) = mean reward of the episodes that took a at s - mean reward of every episode at s

(Q(s, a) - V(s); divided by the std of the rewards at s under grpo): siblings of equal reward get 0, and the
turns that siblings share (their common prefix: the same action at the same state) get 0 too. A turn at a state
no other episode reached gets 0. Each sampled token then trains with

    A = A_episode + w * A_step(its turn)       (w: trainer.step_advantage_weight)

where the prefix a branched episode shares with its siblings is trained once (masked out in all but the first,
:func:`fork_mask`), with the mean of the siblings' episode advantages.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Hashable, Sequence

Turn = tuple[Hashable, Hashable]  # (state key, action key)


def _key(ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(b",".join(str(i).encode() for i in ids), digest_size=16).digest()


def turn_keys(prompt_ids: Sequence[int], response_ids: Sequence[int],
              spans: Sequence[tuple[int, int]]) -> list[Turn]:
    """(state, action) keys of an episode's sampled turns (``spans``: (start, end) within ``response_ids``)."""
    ids = list(prompt_ids) + list(response_ids)
    base = len(prompt_ids)
    return [(_key(ids[: base + start]), _key(ids[base + start: base + end])) for start, end in spans]


def anchor_step_advantages(rewards: Sequence[float], turns: Sequence[Sequence[Turn]], groups: Sequence[Hashable],
                           *, normalize_std: bool = False, eps: float = 1e-6) -> list[list[float]]:
    """Per episode, per turn: A_step(s, a) among the episodes of the same group (``groups``) at the same state
    (see the module doc); 0 where fewer than two episodes reached the state."""
    if not len(rewards) == len(turns) == len(groups):
        raise ValueError(f"{len(rewards)} rewards, {len(turns)} turn lists, {len(groups)} group ids")
    at_state: dict[tuple[Hashable, Hashable], list[int]] = defaultdict(list)
    at_action: dict[tuple[Hashable, Hashable, Hashable], list[int]] = defaultdict(list)
    for e, episode in enumerate(turns):
        for state, action in episode:
            at_state[(groups[e], state)].append(e)
            at_action[(groups[e], state, action)].append(e)
    out: list[list[float]] = []
    for e, episode in enumerate(turns):
        row = []
        for state, action in episode:
            here = at_state[(groups[e], state)]
            if len(set(here)) < 2:
                row.append(0.0)
                continue
            values = [float(rewards[i]) for i in here]
            if max(values) == min(values):  # no contrast at this state (exactly 0, not a rounding's remainder)
                row.append(0.0)
                continue
            v = sum(values) / len(values)
            took = [float(rewards[i]) for i in at_action[(groups[e], state, action)]]
            a = sum(took) / len(took) - v
            if normalize_std:
                var = sum((x - v) ** 2 for x in values) / (len(values) - 1)
                a = a / (var ** 0.5 + eps)
            row.append(a)
        out.append(row)
    return out


def fork_mask(loss_mask: Sequence[int], fork_at: int, sibling: int) -> list[int]:
    """The loss mask of sibling ``sibling`` of a fork at response index ``fork_at``: the shared prefix is trained
    once, in sibling 0; the others train only what they sampled after the fork."""
    if sibling == 0 or fork_at <= 0:
        return list(loss_mask)
    return [0 if i < fork_at else m for i, m in enumerate(loss_mask)]


def token_advantages(episode_advantage: float, prefix_advantage: float, fork_at: int,
                     spans: Sequence[tuple[int, int]], step: Sequence[float], length: int,
                     weight: float) -> list[float]:
    """One advantage per response token: ``prefix_advantage`` before ``fork_at`` (the shared prefix; -1 or 0: no
    fork), ``episode_advantage`` from it on, plus ``weight`` times the step advantage of the turn a token is in."""
    out = [prefix_advantage if i < fork_at else episode_advantage for i in range(length)]
    if weight:
        for (start, end), a in zip(spans, step, strict=True):
            for i in range(start, min(end, length)):
                out[i] += weight * a
    return out


def step_estimator_normalizes(advantage: str) -> bool:
    """grpo divides the step term by the std at the state, as it does the episode term; the others do not."""
    return advantage == "grpo"


def prefix_advantages(episode_advantages: dict[int, float], forks: Sequence[tuple[Hashable, int] | None]) -> dict[int, float]:
    """{episode: the advantage its shared prefix trains with}: the mean episode advantage of its scored siblings
    (``forks[i]``: (fork key, sibling index), None when the episode was not forked), so the prefix, trained once,
    gets what K copies of it would have got together, divided by K."""
    siblings: dict[Hashable, list[float]] = defaultdict(list)
    for i, a in episode_advantages.items():
        if (fork := forks[i]) is not None:
            siblings[fork[0]].append(a)
    out = {}
    for i, a in episode_advantages.items():
        fork = forks[i]
        out[i] = a if fork is None else sum(siblings[fork[0]]) / len(siblings[fork[0]])
    return out


def spec_indices(forks: Sequence[tuple[int, int] | None]) -> list[int]:
    """Which played spec each trajectory of a rollout belongs to: a rollout lists each spec's episode (unforked,
    or sibling 0) followed by its siblings (``forks[i]``: (sibling, fork_at) or None)."""
    out, spec = [], -1
    for fork in forks:
        if fork is None or fork[0] == 0:
            spec += 1
        out.append(max(spec, 0))
    return out


def episode_token_advantages(episode_advantages: dict[int, float], rewards: Sequence[float],
                             groups: Sequence[Hashable], prompts: Sequence[Sequence[int]],
                             responses: Sequence[Sequence[int]], spans: Sequence[Sequence[tuple[int, int]]],
                             forks: Sequence[tuple[int, int] | None], *, weight: float,
                             normalize_std: bool = False) -> dict[int, list[float]]:
    """{episode: one advantage per response token} for the scored episodes (``episode_advantages``): the episode
    advantage, the siblings' mean on a shared prefix, plus ``weight`` x the step advantage among the scored
    episodes of its group at each turn's state (:func:`anchor_step_advantages`)."""
    scored = sorted(episode_advantages)
    specs = spec_indices(forks)
    keyed: list[tuple[Hashable, int] | None] = [None] * len(forks)
    for i, fork in enumerate(forks):
        if fork is not None:
            keyed[i] = (specs[i], fork[0])
    prefix = prefix_advantages(episode_advantages, keyed)
    step: dict[int, list[float]] = {}
    if weight:
        turns = [turn_keys(prompts[i], responses[i], spans[i]) for i in scored]
        rows = anchor_step_advantages([rewards[i] for i in scored], turns, [groups[i] for i in scored],
                                      normalize_std=normalize_std)
        step = dict(zip(scored, rows, strict=True))
    out = {}
    for i in scored:
        fork_at = fork[1] if (fork := forks[i]) is not None else -1
        out[i] = token_advantages(episode_advantages[i], prefix[i], fork_at, spans[i],
                                  step.get(i, [0.0] * len(spans[i])), len(responses[i]), weight)
    return out
