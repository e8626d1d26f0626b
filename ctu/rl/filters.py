"""Reward and mask filters applied to finished episodes (pure functions; all off by default).

The length filter looks at each assistant message on its own: a long multi-turn episode
whose messages are each short keeps its reward. (The system ctu replaces measured the
whole conversation and so zeroed good multi-turn episodes.)
"""

from __future__ import annotations

from collections.abc import Sequence


def spans_lengths(spans: Sequence[tuple[int, int]]) -> list[int]:
    """Token count of each assistant message, from its (start, end) span."""
    return [end - start for start, end in spans]


def too_long(assistant_lengths: Sequence[int], max_tokens: int | None) -> bool:
    """True when any single assistant message has more than ``max_tokens`` tokens."""
    return max_tokens is not None and any(n > max_tokens for n in assistant_lengths)


def filter_reward(
    reward: float,
    assistant_lengths: Sequence[int],
    stop_reason: str,
    *,
    max_assistant_tokens: int | None = None,
    zero_on_length_stop: bool = False,
) -> float:
    """The reward after the optional filters: per-message length cap, zero on a 'length' stop."""
    if too_long(assistant_lengths, max_assistant_tokens):
        return 0.0
    if zero_on_length_stop and stop_reason == "length":
        return 0.0
    return reward


def filter_loss_mask(loss_mask: Sequence[int], stop_reason: str, *, mask_length_stop: bool = False) -> list[int]:
    """The loss mask, all zeros when the episode was cut by the token limit and masking is on."""
    if mask_length_stop and stop_reason == "length":
        return [0] * len(loss_mask)
    return list(loss_mask)
