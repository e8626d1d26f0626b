"""verl's custom reward function for ctu's parquet tasks.

In verl's config::

    reward.custom_reward_function.path=pkg://ctu.app.integrations.verl_reward
    reward.custom_reward_function.name=compute_score

verl calls ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` per sample, where
``solution_str`` is the decoded response (for the tool agent loop: every assistant turn with the tool results
and user turns between them) and ``extra_info`` the row's (plus the agent loop's ``tool_extra_fields``,
``num_turns``). Rows of ``ctu/<domain>`` are scored with ctu's tau2 reward: the response's tool calls are
re-executed on the task's initial DB and its text checked, as ``ctu score`` does; any other data source goes to
verl's ``default_compute_score``. ``extra_info.termination`` (``user_stop``/``agent_stop``/...) overrides the
ending read from the text. ``extra_info.messages`` (the whole transcript as OpenAI messages, e.g. recorded by
an agent loop in its ``extra_fields``) is scored instead of the text when given; dual-control domains
(telecom: the user acts on their own phone) need it, since the user's actions are not in the agent's text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctu.app.integrations.common import plain, response_messages, task_of, termination_of
from ctu.episode.data.conversations import DataError
from ctu.episode.reward import score_transcript
from ctu.episode.transcripts import ending

PREFIX = "ctu/"


def score_response(data_source: str, solution_str: str, ground_truth: Any,
                   extra_info: Mapping[str, Any] | None = None) -> dict[str, float]:
    """{"score": the tau2 reward, "acc": 1.0 if solved, "tool_calls", "parse_failures"} of one response."""
    info = plain(extra_info or {})
    try:
        domain, task = task_of(ground_truth, info, data_source, info.get("data_dir"))
    except (DataError, KeyError) as exc:
        where = f"{data_source} row {info['index']}" if "index" in info else data_source
        raise DataError(f"{where}: {exc.args[0] if exc.args else exc}") from None
    if info.get("messages"):  # the whole transcript, recorded by the agent loop (dual control needs it)
        messages, failures = list(info["messages"]), 0
        termination = info.get("termination") or ending(messages, None)
    elif domain.user_tools:
        raise DataError(f"{data_source}: dual control: the user's own tool calls (their phone) are not in the "
                        "agent's response text; pass the transcript as extra_info.messages (OpenAI messages with "
                        "the user's tool calls), or train this domain with the SkyRL env")
    else:
        messages, failures = response_messages(solution_str or "")
        termination = info.get("termination") or termination_of(messages, domain.transfer_tool)
    reward = score_transcript(domain, task, messages, termination).reward
    calls = sum(len(m.get("tool_calls") or []) for m in messages)
    return {"score": float(reward), "acc": float(reward == 1.0), "tool_calls": float(calls),
            "parse_failures": float(failures)}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """verl's reward function signature; ``ctu/*`` rows scored by ctu, the rest by verl's default."""
    if str(data_source).startswith(PREFIX):
        return score_response(str(data_source), solution_str, ground_truth, extra_info)
    from verl.utils.reward_score import default_compute_score  # only when verl runs it

    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
