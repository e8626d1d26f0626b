import asyncio
import json

import pytest

from ctu.domains.base import canonical, run_tool
from ctu.domains.mini import load
from ctu.episode.env import AgentTurn, Episode, ToolCall
from ctu.episode.reward import score_transcript
from ctu.episode.transcripts import gold_transcript
from ctu.episode.users.scripted import ScriptedUser

DOMAIN = load(seed=0)


def test_deterministic_in_the_seed():
    again = load(seed=0)
    assert canonical(again.db) == canonical(DOMAIN.db)
    assert [t.user_scenario for t in again.tasks] == [t.user_scenario for t in DOMAIN.tasks]
    other = load(seed=1)
    assert [t.user_scenario for t in other.tasks] != [t.user_scenario for t in DOMAIN.tasks]


def test_small_policy_few_tools_many_tasks_and_clean_splits():
    assert len(DOMAIN.policy.split()) <= 150
    assert 3 <= len(DOMAIN.tools) <= 4
    assert len(DOMAIN.tasks) >= 200
    train, test = set(DOMAIN.splits["train"]), set(DOMAIN.splits["test"])
    assert not train & test and train | test == {t.id for t in DOMAIN.tasks}
    for split in (train, test):
        refusals = sum(DOMAIN.task(i).description["refusal"] for i in split)
        assert 0.1 <= refusals / len(split) <= 0.4


def test_gold_scores_one_and_doing_nothing_scores_zero_except_on_refusals():
    for task in DOMAIN.tasks:
        assert score_transcript(DOMAIN, task, gold_transcript(DOMAIN, task), "user_stop").reward == 1.0
        idle = [{"role": "assistant", "content": "Sorry, I cannot help."}, {"role": "user", "content": "###STOP###"}]
        expected = 1.0 if task.description["refusal"] and not task.communicate_info else 0.0
        assert score_transcript(DOMAIN, task, idle, "user_stop").reward == expected


def test_tool_errors_leave_the_db_unchanged():
    statuses = {o["status"]: oid for oid, o in DOMAIN.db["orders"].items()}
    cases = [("cancel_order", {"order_id": statuses["shipped"]}), ("return_order", {"order_id": statuses["pending"]}),
             ("change_address", {"order_id": statuses["delivered"], "address": "1 Oak St"}),
             ("get_order", {"order_id": "O9"}), ("cancel_order", {})]
    for name, args in cases:
        view = DOMAIN.new_db()
        assert run_tool(DOMAIN.tool(name), view, args, name).error
        assert view.touched() == set()
    for schema in DOMAIN.openai_tools():
        assert schema["type"] == "function" and schema["function"]["parameters"]["type"] == "object"


def play(task, turns):
    async def go():
        ep = Episode(DOMAIN, task, ScriptedUser().start(DOMAIN, task))
        await ep.reset()
        for turn in turns:
            if ep.done:
                break
            await ep.step(turn)
        return ep

    return asyncio.run(go())


def test_episodes_end_to_end_with_the_scripted_user():
    for kind in ("status", "cancel", "change_address", "return"):
        for refusal in (False, True):
            if kind == "status" and refusal:
                continue
            task = next(t for t in DOMAIN.tasks if t.description["kind"] == kind and t.description["refusal"] == refusal)
            turns = [AgentTurn(tool_calls=(ToolCall(a.name, dict(a.arguments)),)) for a in task.actions]
            turns.append(AgentTurn(content="Done. " + " ".join(task.communicate_info)))
            ep = play(task, turns)
            assert ep.termination == "user_stop" and ep.reward().reward == 1.0, (kind, refusal)
    task = next(t for t in DOMAIN.tasks if t.description["kind"] == "cancel" and not t.description["refusal"])
    oid = task.actions[0].arguments["order_id"]
    wrong = play(task, [AgentTurn(tool_calls=(ToolCall("change_address", {"order_id": oid, "address": "1 Elm Rd"}),)),
                        AgentTurn(content="Done.")])
    assert wrong.termination == "user_stop" and wrong.reward().reward == 0.0


def test_the_prompt_is_short():
    from ctu.episode.env import system_prompt

    text = system_prompt(DOMAIN) + json.dumps([t["function"] for t in DOMAIN.openai_tools()])
    assert len(text) <= 1800


def test_each_write_request_has_a_twin_asking_the_same_of_an_order_whose_status_calls_for_the_other_outcome():
    from ctu.domains.mini import ALLOWED

    twinned = 0
    for task in DOMAIN.tasks:
        twin = DOMAIN.twin_of(task)
        if task.description["kind"] == "status":
            assert twin is None
            continue
        twinned += 1
        assert twin.id == task.id + "~twin" and DOMAIN.task(twin.id) is twin and DOMAIN.twin_of(task) is twin
        assert twin.user_scenario == task.user_scenario  # the same words, the same order
        assert twin.description["kind"] == task.description["kind"]
        assert twin.description["refusal"] != task.description["refusal"]
        (init,) = twin.initial_state["initialization_actions"]
        status = init["arguments"]["status"]
        assert (status == ALLOWED[task.description["kind"]]) == task.description["refusal"]
        assert DOMAIN.initial_db(twin).get("orders", task.actions[0].arguments["order_id"])["status"] == status
        # the twin's gold scores 1; the task's own gold (the other outcome) scores 0 on the twin
        assert score_transcript(DOMAIN, twin, gold_transcript(DOMAIN, twin), "user_stop").reward == 1.0
        assert score_transcript(DOMAIN, twin, gold_transcript(DOMAIN, task), "user_stop").reward == 0.0
        assert DOMAIN.twin_of(twin) is None
    assert twinned >= 200
    assert canonical(DOMAIN.db) == canonical(load(seed=0).db)  # a twin's start changes no other episode's


def test_a_twin_is_found_by_its_id_in_a_fresh_copy_of_the_domain():
    task = next(t for t in DOMAIN.tasks if t.description["kind"] == "return")
    fresh = load(seed=0)  # e.g. a rollout worker that rebuilds episodes by task id
    assert fresh.task(task.id + "~twin") == DOMAIN.twin_of(task)
    status = next(t for t in DOMAIN.tasks if t.description["kind"] == "status")
    for missing in (status.id + "~twin", "mini-9999~twin"):
        with pytest.raises(KeyError, match="no task"):
            fresh.task(missing)
