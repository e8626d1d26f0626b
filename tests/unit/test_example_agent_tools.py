"""examples/byo_agent/agent_with_tools.py plays episodes through ctu's proxy with a tool of its own: a call to its
``calculate`` is answered by the agent (its result is in the model's next prompt), the rest of the episode goes to
the environment, and the episode finishes scored like any other."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ctu.engines.base import SamplingParams
from tests.unit.distributed.test_agent_pool import pool, specs  # noqa: F401 - the fixture

AGENT = Path(__file__).resolve().parents[2] / "examples" / "byo_agent" / "agent_with_tools.py"


@pytest.mark.slow  # an agent process and a proxy: ~7 s on 2 busy cores
def test_the_agent_answers_its_own_tool_and_the_environment_the_rest(pool, chat_format):  # noqa: F811
    texts = ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 * (19.5 + 1)"}}\n</tool_call>',
             "Order O1082 is pending.")  # the agent's own tool first, then the answer to the customer
    agents = pool(f"{sys.executable} {AGENT}", texts)
    (trajectory,) = agents.run(specs(1), SamplingParams(max_tokens=64, seed=0), seed=0)
    assert trajectory.stop_reason == "done" and trajectory.termination == "user_stop"
    assert not any(m.get("tool_calls") for m in trajectory.messages)  # the environment saw no tool call
    second = chat_format.tokenizer.decode(agents.engine.prompts[-1])
    assert "calculate" in second and "41" in second.split("calculate")[-1]  # the agent's answer, in the next prompt


def test_calculate_parses_arithmetic_and_refuses_the_rest():
    sys.path.insert(0, str(AGENT.parent))
    try:
        from agent_with_tools import calculate, own_calls
    finally:
        sys.path.remove(str(AGENT.parent))
    assert calculate("2 * 19.99 + 5") == "44.98" and calculate("-(1 + 2) / 4") == "-0.75"
    assert calculate("__import__('os')").startswith("Error") and calculate("1/0").startswith("Error")
    own = {"function": {"name": "calculate", "arguments": "{}"}}
    env = {"function": {"name": "get_order", "arguments": "{}"}}
    assert own_calls({"tool_calls": [own]}) == [own] and own_calls({"tool_calls": [own, env]}) == []
    assert own_calls({"content": "hi"}) == []
