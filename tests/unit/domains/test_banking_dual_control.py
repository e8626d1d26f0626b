"""banking_knowledge with ctu's users: the scripted user acts from the task (its user-side gold actions) through the
real episode loop, and the gold demonstrations that warm-start training solve the tasks."""

from __future__ import annotations

import asyncio

import pytest

from ctu.domains import get_domain
from ctu.episode.env import AgentTurn, Episode
from ctu.episode.reward import score_transcript
from ctu.episode.users.base import is_stop
from ctu.episode.users.scripted import ScriptedUser


@pytest.fixture(scope="module")
def bank(tau2_bench_data):
    return get_domain("banking_knowledge", tau2_bench_data)


def test_the_scripted_user_never_opens_with_a_stop_token(bank):
    """Instructions that tell the user how to end the call (task_060: "end the conversation with ... ###STOP###")
    are not an ending when the scripted user reads them out."""
    task = bank.task("task_060")
    assert "###STOP###" in task.user_scenario["instructions"]
    episode = Episode(bank, task, ScriptedUser().start(bank, task))
    asyncio.run(episode.reset())
    assert not episode.done and not is_stop(episode.messages[-1]["content"])


def test_the_scripted_user_runs_its_gold_call_when_the_agent_names_the_tool(bank):
    task = bank.task("task_001")  # the user applies for the Gold Rewards Card with their own tool
    episode = Episode(bank, task, ScriptedUser().start(bank, task), max_turns=4)
    asyncio.run(episode.reset())
    asyncio.run(episode.step(AgentTurn(content="The Gold Rewards Card fits; please use apply_for_credit_card.")))
    calls = [c["function"]["name"] for m in episode.messages if m["role"] == "user" for c in m.get("tool_calls", [])]
    assert calls == ["apply_for_credit_card"]
    asyncio.run(episode.step(AgentTurn(content="Your application is in. Goodbye.")))
    assert episode.termination == "user_stop" and episode.reward().reward == 1.0


def test_gold_demonstrations_solve_the_tasks_with_the_scripted_user(bank):
    from ctu.episode.data.conversations import gold_conversation

    solved = []
    for task in bank.tasks:
        conversation = gold_conversation(bank, task)
        messages = [m for m in conversation.messages if m["role"] != "system"]
        reward = score_transcript(bank, task, messages, conversation.termination)
        solved.append(reward.reward == 1.0)
    assert sum(solved) == len(bank.tasks) == 97
