"""Misaligned tool messages: tau2 refuses to score them, and so does ``ctu score``.

tau2's evaluator replays a transcript with ``Environment.set_state``, which pairs every call with the tool message
right after it, in call order, and raises ``ValueError`` otherwise; its ``ToolMessage`` only takes ``requestor``
``user`` or ``assistant``. ctu's ``parse_line`` (what ``ctu score`` reads a line with) refuses the same
transcripts with a :class:`~ctu.episode.transcripts.TranscriptError`. One divergence, asserted below: a tool message whose
requestor names the other side is scored by tau2 (its replay routes by the call, not the result) and refused by ctu.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tau2.evaluator.evaluator", reason="tau2's evaluator is not installed (run `nox -s oracle`)")

from ctu.episode.transcripts import TranscriptError  # noqa: E402
from tests.oracle import bridge  # noqa: E402
from tests.oracle.strategies import Plan, Turn, gold_plan  # noqa: E402
from tests.oracle.test_oracle import _oracle, ctu_score  # noqa: E402


def _first_tool(m: list[dict]) -> int:
    return next(i for i, x in enumerate(m) if x["role"] == "tool")


def unknown_id(m):
    m[_first_tool(m)]["tool_call_id"] = "call_nobody_made"


def missing_result(m):
    del m[_first_tool(m)]


def second_result(m):
    i = _first_tool(m)
    m.insert(i + 1, dict(m[i]))


def results_out_of_order(m):
    i = _first_tool(m)
    m[i], m[i + 1] = m[i + 1], m[i]


def tool_message_first(m):
    m.insert(0, dict(m[_first_tool(m)]))


def missing_tool_call_id(m):
    del m[_first_tool(m)]["tool_call_id"]


def bogus_requestor(m):
    m[_first_tool(m)]["requestor"] = "robot"


DEFECTS = (unknown_id, missing_result, second_result, results_out_of_order, tool_message_first,
           missing_tool_call_id, bogus_requestor)


@pytest.fixture(scope="module")
def retail():
    """A retail task with two or more gold calls, its first two made in one assistant message (results in order)."""
    oracle, pool, usable = _oracle("retail")
    task_id = next(t for t in usable if len(pool.gold[t]) >= 2)
    plan = gold_plan(pool, task_id)
    turns = list(plan.turns)
    k = next(i for i, t in enumerate(turns) if t.calls)
    turns[k:k + 2] = [Turn("assistant", None, turns[k].calls + turns[k + 1].calls)]
    messages = bridge.materialize(oracle, Plan(plan.domain, task_id, "two_calls", tuple(turns)))
    return oracle, task_id, messages


def test_the_aligned_transcript_scores_one_in_both(retail):
    oracle, task_id, messages = retail
    assert bridge.tau2_score(oracle, task_id, messages, None).reward == 1.0
    assert ctu_score("retail", task_id, messages, None).reward == 1.0


@pytest.mark.parametrize("defect", DEFECTS, ids=lambda f: f.__name__)
def test_tau2_and_ctu_both_refuse_a_misaligned_transcript(retail, defect):
    oracle, task_id, aligned = retail
    messages = json.loads(json.dumps(aligned))
    defect(messages)
    with pytest.raises(ValueError):  # tau2: set_state's ValueError, or pydantic's ValidationError (a ValueError)
        bridge.tau2_score(oracle, task_id, messages, None)
    with pytest.raises(TranscriptError):
        ctu_score("retail", task_id, messages, None)


def test_a_result_claiming_the_other_side_is_scored_by_tau2_and_refused_by_ctu(retail):
    oracle, task_id, aligned = retail
    messages = json.loads(json.dumps(aligned))
    messages[_first_tool(messages)]["requestor"] = "user"  # it answers an assistant call
    assert bridge.tau2_score(oracle, task_id, messages, None).reward == 1.0
    with pytest.raises(TranscriptError, match=r"requestor is 'user' but it answers .*a call by the assistant"):
        ctu_score("retail", task_id, messages, None)
