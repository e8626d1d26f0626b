"""Stitching: an episode's chat-completion requests -> token-exact training samples.

An agent that talks to ctu through the OpenAI-compatible proxy (``ctu.rollout.agent_proxy``) makes one request per
assistant turn; the proxy records each request's prompt ids, the ids the engine sampled, their logprobs and the
policy version that sampled them (a :class:`TurnRecord`). :func:`stitch` joins them exactly as ctu's own loop
builds a :class:`~ctu.rollout.chat.TokenSequence`: a request whose prompt ids start with the previous request's
prompt + sampled ids continues the same sample, its new tail (tool results, user turns, the next generation prompt)
appended with loss mask 0 and its sampled ids with loss mask 1. A request whose prompt does not extend the previous
one (the agent rewrote or dropped history, or a turn was cut by ``max_tokens``) starts a new sample. Every sampled
token lands in exactly one sample; the samples of one episode share its reward (and so its advantage) in training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ctu.rollout.chat import TokenSequence


@dataclass(frozen=True)
class TurnRecord:
    """One request as the proxy served it."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    version: int  # the policy version of the weights that sampled ``completion_ids``
    token_versions: tuple[int, ...] | None = None  # per id, where the weights changed mid-completion

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.completion_ids)} sampled ids but {len(self.logprobs)} logprobs")


@dataclass
class TokenSample:
    """One token-exact sample: what :class:`~ctu.rollout.loop.Trajectory` holds, for one unbroken conversation."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    token_versions: list[int]  # per response id: the sampling version, -1 where the mask is 0
    assistant_spans: list[tuple[int, int]] = field(default_factory=list)
    turns: int = 0  # requests stitched into it

    def to_json(self) -> dict[str, Any]:
        return {"prompt_ids": self.prompt_ids, "response_ids": self.response_ids, "loss_mask": self.loss_mask,
                "logprobs": self.logprobs, "token_versions": self.token_versions, "turns": self.turns}


def extends(seen: Sequence[int], prompt: Sequence[int]) -> bool:
    """Whether ``prompt`` starts with every id of ``seen`` (the previous prompt + sampled ids)."""
    return len(prompt) >= len(seen) and list(prompt[: len(seen)]) == list(seen)


def _close(seq: TokenSequence, versions: list[int], turns: int) -> TokenSample:
    return TokenSample(list(seq.prompt_ids), list(seq.response_ids), list(seq.loss_mask), list(seq.logprobs),
                       versions, seq.assistant_spans(), turns)


def stitch(records: Sequence[TurnRecord]) -> list[TokenSample]:
    """The samples of one episode's requests, in order (see the module docstring for the rule)."""
    samples: list[TokenSample] = []
    seq: TokenSequence | None = None
    versions: list[int] = []
    turns = 0
    for record in records:
        if seq is not None and extends(seq.all_ids(), record.prompt_ids):
            tail = list(record.prompt_ids[seq.total_length():])
            seq.add_observation(tail)
            versions += [-1] * len(tail)
        else:
            if seq is not None:
                samples.append(_close(seq, versions, turns))
            seq, versions, turns = TokenSequence.start(record.prompt_ids), [], 0
        seq.add_generated(record.completion_ids, record.logprobs)
        versions += list(record.token_versions or [record.version] * len(record.completion_ids))
        turns += 1
    if seq is not None:
        samples.append(_close(seq, versions, turns))
    return samples


def trajectory_samples(trajectory: Any) -> list[tuple[list[int], list[int], list[int], list[float]]]:
    """``(prompt_ids, response_ids, loss_mask, logprobs)`` of every sample of a trajectory: its earlier samples
    (``extra_samples``, an agent that rewrote its history) first, then its own tokens. Trained with one advantage."""
    extra = getattr(trajectory, "extra_samples", None) or []
    return [*((s.prompt_ids, s.response_ids, s.loss_mask, s.logprobs) for s in extra),
            (trajectory.prompt_ids, trajectory.response_ids, trajectory.loss_mask, trajectory.logprobs)]
