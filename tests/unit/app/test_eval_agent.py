"""`ctu eval` with ``agent.command``: the user's agent program plays the evaluation's episodes (docs/agents.md), as
it plays the training ones; the engine is a script (no model), the agent the example one."""

from __future__ import annotations

import json
import sys

from ctu.app.cli import main
from tests.unit.distributed.test_agent_pool import AGENT
from tests.unit.rollout.test_agent_proxy import ScriptEngine


class ToolThenAnswer(ScriptEngine):
    """Each episode: a tool call, then (its prompt holds the tool's result) an answer."""

    def __init__(self, chat):
        super().__init__(chat, [])

    async def generate(self, prompts, params, seeds=None):
        for prompt in prompts:
            done = "<tool_response>" in self.chat.tokenizer.decode(prompt)
            self.texts.append("Order O1082 is pending." if done else
                              '<tool_call>\n{"name": "get_order", "arguments": {"order_id": "O1082"}}\n</tool_call>')
        return await super().generate(prompts, params, seeds)


def test_eval_runs_the_agent_command_for_each_episode(tmp_path, monkeypatch, chat_format):
    # it played every episode with ctu's own loop whatever agent.command said: a user could train their agent
    # but not evaluate it
    monkeypatch.setattr("ctu.rollout.components.build_engine", lambda config, **_: ToolThenAnswer(chat_format))
    run_dir = tmp_path / "eval"
    assert main(["eval", "model.path=tiny-random", "eval.max_tasks=2", "sampling.max_tokens=64", "env.max_turns=3",
                 f"run.dir={run_dir}", f"agent.command={sys.executable} {AGENT}", "agent.timeout_s=60"]) == 0
    rows = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    played = {r["task_id"]: r for r in map(json.loads, (run_dir / "agent" / "episodes.jsonl").read_text().splitlines())}
    assert len(rows) == 2 and sorted(played) == sorted(r["task_id"] for r in rows)
    assert all(r["messages"] == played[r["task_id"]]["messages"] and r["turns"] == 2 for r in rows)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["overall"]["episodes"] == 2 and report["overall"]["errored"] == 0
