"""``ctu score`` refuses transcripts whose tool messages do not line up with their calls, as tau2's replay does
(``Environment.set_state`` raises ValueError on them): a result with an unknown ``tool_call_id``, a call without a
result, a second result for one call, results out of call order, a tool message before any call, and a bogus
``requestor``. Each is a gold transcript (reward 1.0) with one defect; the error names the line and the message."""

import json

import pytest

from ctu.app.cli import main
from ctu.domains import get_domain
from ctu.episode.reward import score_transcript
from ctu.episode.transcripts import TranscriptError, check_tool_results, ending, gold_transcript, parse_line

RETAIL = get_domain("retail")
TELECOM = get_domain("telecom")


def retail_task_with_calls(n: int):
    return next(t for t in RETAIL.tasks if len(t.actions) >= n)


def gold(domain, task) -> list[dict]:
    return json.loads(json.dumps(gold_transcript(domain, task)))  # a deep copy to edit


def first(messages, role="tool", **match) -> int:
    return next(i for i, m in enumerate(messages) if m["role"] == role and all(m.get(k) == v for k, v in match.items()))


def two_calls_in_one_message(messages: list[dict]) -> list[dict]:
    """The first two assistant calls made in one message, their results after it (in order)."""
    a = first(messages, "assistant", content="")
    call_a, result_a, call_b, result_b = messages[a:a + 4]
    assert call_b["role"] == "assistant" and result_b["role"] == "tool"
    merged = {**call_a, "tool_calls": call_a["tool_calls"] + call_b["tool_calls"]}
    return messages[:a] + [merged, result_a, result_b] + messages[a + 4:]


def unknown_id(m):
    m[first(m)]["tool_call_id"] = "call_nobody_made"
    return m


def missing_result(m):
    del m[first(m)]
    return m


def second_result(m):
    i = first(m)
    return m[:i + 1] + [dict(m[i])] + m[i + 1:]


def results_out_of_order(m):
    m = two_calls_in_one_message(m)
    i = first(m)
    m[i], m[i + 1] = m[i + 1], m[i]
    return m


def tool_message_first(m):
    i = first(m)
    return [m[i]] + m


def bogus_requestor(m):
    m[first(m)]["requestor"] = "robot"
    return m


def requestor_of_the_other_side(m):
    m[first(m)]["requestor"] = "user"  # it answers an assistant call
    return m


def missing_tool_call_id(m):
    del m[first(m)]["tool_call_id"]
    return m


DEFECTS = {
    unknown_id: r"messages\[3\]\.tool_call_id is 'call_nobody_made', expected 'gold_0': the result of "
                r"messages\[2\]\.tool_calls\[0\] \(id 'gold_0'\)",
    missing_result: r"messages\[2\]\.tool_calls\[0\] \(id 'gold_0'\) has no result: messages\[3\] is an "
                    r"assistant message",
    second_result: r"messages\[4\] is a tool message with tool_call_id 'gold_0' that answers the call of "
                   r"messages\[2\] again",
    results_out_of_order: r"messages\[3\]\.tool_call_id is 'gold_1', expected 'gold_0'",
    tool_message_first: r"messages\[0\] is a tool message with tool_call_id 'gold_0' that answers no call",
    bogus_requestor: r"messages\[3\]\.requestor must be user or assistant, got 'robot'",
    requestor_of_the_other_side: r"messages\[3\]\.requestor is 'user' but it answers messages\[2\]\.tool_calls\[0\] "
                                 r"\(id 'gold_0'\), a call by the assistant",
    missing_tool_call_id: r"messages\[3\]\.tool_call_id is missing \(expected 'gold_0'",
}


def line(task, messages) -> str:
    return json.dumps({"task_id": task.id, "messages": messages})


def test_the_gold_transcripts_line_up():
    for domain in (RETAIL, TELECOM):  # telecom: the user's own calls answered with requestor user
        for task in domain.tasks[:20]:
            check_tool_results(gold_transcript(domain, task))
    task = retail_task_with_calls(2)
    check_tool_results(two_calls_in_one_message(gold(RETAIL, task)))


@pytest.mark.parametrize("defect", list(DEFECTS), ids=lambda f: f.__name__)
def test_a_misaligned_transcript_is_refused_naming_the_message(defect):
    task = retail_task_with_calls(2)
    messages = defect(gold(RETAIL, task))
    with pytest.raises(TranscriptError, match=DEFECTS[defect]) as got:
        parse_line(line(task, messages))
    assert "\n" not in str(got.value)


def test_these_transcripts_scored_one_before():
    """What the refusal replaces: ctu's scoring alone gives every one of them the gold reward."""
    task = retail_task_with_calls(2)
    for defect in DEFECTS:
        messages = defect(gold(RETAIL, task))
        assert score_transcript(RETAIL, task, messages, ending(messages, None)).reward == 1.0, defect.__name__


def test_a_user_call_answered_as_the_assistant_is_refused():
    task = next(t for t in TELECOM.tasks if any(a.requestor == "user" for a in t.actions))
    messages = gold(TELECOM, task)
    i = first(messages, requestor="user")
    messages[i]["requestor"] = "assistant"
    with pytest.raises(TranscriptError, match=rf"messages\[{i}\]\.requestor is 'assistant' but it answers "
                                              rf"messages\[{i - 1}\]\.tool_calls\[0\] .*a call by the user"):
        parse_line(line(task, messages))


def test_score_names_the_file_line_and_scores_the_rest(tmp_path, capsys):
    task = retail_task_with_calls(2)
    good = line(task, gold(RETAIL, task))
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([good, line(task, second_result(gold(RETAIL, task))), good]) + "\n")
    assert main(["score", "--domain", "retail", str(path), "--json"]) == 1
    captured = capsys.readouterr()
    rows = [json.loads(x) for x in captured.out.splitlines()]
    assert [r.get("reward") for r in rows] == [1.0, None, 1.0]
    errors = [x for x in captured.err.splitlines() if ": error: " in x]
    assert errors == [f"{path}:2: error: messages[4] is a tool message with tool_call_id 'gold_0' that answers the "
                      "call of messages[2] again (each tool message must follow its call, one result per call, in "
                      "call order)"]
