"""AgentPool: the user's agent command plays each episode; a crash or a timeout is an errored episode (never a
reward of 0) with the agent's output kept in the run dir; a finished one is recorded with its tokens."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ctu.distributed.agent_pool import AgentPool
from ctu.domains import get_domain
from ctu.engines.base import SamplingParams
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.loop import EpisodeSpec, RolloutLimits
from tests.unit.rollout.test_agent_proxy import ScriptEngine

AGENT = Path(__file__).resolve().parents[3] / "examples" / "byo_agent" / "agent.py"


class TurnEngine(ScriptEngine):
    """Answers an episode's first call with ``first`` and any later one (a longer prompt: the tool's result is in
    it) with ``then``, whichever episode asks first. A shared script popped in call order raced with two agents
    in flight: under load one episode got the other's second answer (a fresh clone's test run, 2026-11-26)."""

    def __init__(self, chat, first, then):
        super().__init__(chat, [])
        self.first, self.then, self.shortest = first, then, None

    async def generate(self, prompts, params, seeds=None):
        for prompt in prompts:
            self.shortest = min(len(prompt), self.shortest or len(prompt))
            self.texts.append(self.then if len(prompt) > self.shortest else self.first)
        return await super().generate(prompts, params, seeds)


@pytest.fixture
def pool(chat_format, tmp_path):
    made = []

    def make(command, texts=(), timeout_s=60.0):
        engine = TurnEngine(chat_format, *texts) if texts else ScriptEngine(chat_format, texts)
        made.append(AgentPool(engine, chat_format, ScriptedUser(), RolloutLimits(4, 5, 4096),
                              command=command, run_dir=tmp_path, concurrency=2, timeout_s=timeout_s))
        return made[-1]

    yield make
    for p in made:
        p.close()


def specs(n=1):
    domain = get_domain("mini")
    return [EpisodeSpec(domain, domain.task("mini-0000"), i) for i in range(n)]


def test_an_agent_that_crashes_gives_an_errored_episode_with_its_output_kept(pool, tmp_path):
    crash = f"{sys.executable} -c \"import sys; print('agent: no luck', file=sys.stderr); sys.exit(3)\""
    (trajectory,) = pool(crash).run(specs(), SamplingParams(max_tokens=32, seed=0), seed=0)
    assert trajectory.stop_reason == "error" and not trajectory.success
    assert "exited with status 3: agent: no luck" in trajectory.error
    log = tmp_path / "agent" / "logs" / "r0-e0.log"
    assert str(log) in trajectory.error and "no luck" in log.read_text()
    row = json.loads((tmp_path / "agent" / "episodes.jsonl").read_text())
    assert row["stop_reason"] == "error" and row["log"] == str(log)


def test_an_agent_past_its_timeout_is_stopped_and_its_episode_errored(pool):
    sleeper = f"{sys.executable} -c \"import time; time.sleep(60)\""
    (trajectory,) = pool(sleeper, timeout_s=0.5).run(specs(), SamplingParams(max_tokens=32, seed=0), seed=0)
    assert trajectory.stop_reason == "error" and "timed out after 0.5s (agent.timeout_s)" in trajectory.error


def test_the_example_agent_plays_episodes_through_the_proxy(pool, tmp_path):
    texts = ('<tool_call>\n{"name": "get_order", "arguments": {"order_id": "O1082"}}\n</tool_call>',
             "Order O1082 is pending.")  # each episode: the tool call, then the answer
    trajectories = pool(f"{sys.executable} {AGENT}", texts).run(specs(2), SamplingParams(max_tokens=64, seed=0), seed=0)
    assert [t.stop_reason for t in trajectories] == ["done", "done"]
    assert all(t.termination == "user_stop" and t.tool_calls == 1 and t.turns == 2 for t in trajectories)
    assert [m["role"] for m in trajectories[0].messages][-4:] == ["assistant", "tool", "assistant", "user"]
    rows = [json.loads(line) for line in (tmp_path / "agent" / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["episode_id"] for r in rows) == ["r0-e0", "r0-e1"]
    assert not list((tmp_path / "agent" / "logs").iterdir())


@pytest.mark.parametrize(("override", "message"), [
    ("agent.concurrency=0", "agent.concurrency: must be >= 1, got 0"),
    ("agent.timeout_s=0", "agent.timeout_s: must be > 0, got 0.0"),
    ("agent.command=' '", "agent.command: empty"),
])
def test_agent_settings_are_checked_naming_the_key(override, message):
    from ctu.config.schema import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])
    assert load_config(None, ["agent.command=python agent.py", "distributed.rollout_workers=1"])  # agents on workers


def test_an_agent_gets_only_the_documented_variables_and_no_secret(pool, tmp_path, monkeypatch):
    from ctu.distributed.agent_pool import AGENT_VARIABLES, BASE_VARIABLES

    monkeypatch.setenv("MYUSERKEY", "sk-user-simulator-key")  # user.api_key_env=MYUSERKEY: ctu's, not the agent's
    monkeypatch.setenv("AGENT_TOOL_TOKEN", "the-agent-s-own")  # passed because agent.pass_env names it
    monkeypatch.setenv("LANG", "C.UTF-8")
    dump = tmp_path / "env.py"
    dump.write_text("import json, os, sys\nprint(json.dumps(dict(os.environ)))\nsys.exit(1)\n")
    made = pool(f"{sys.executable} {dump}")
    made.pass_env = ("AGENT_TOOL_TOKEN",)
    (trajectory,) = made.run(specs(), SamplingParams(max_tokens=32, seed=0), seed=0)
    seen = json.loads((tmp_path / "agent" / "logs" / "r0-e0.log").read_text().splitlines()[0])
    assert "MYUSERKEY" not in seen and "sk-user-simulator-key" not in json.dumps(seen)
    assert set(seen) - {"AGENT_TOOL_TOKEN"} <= set(BASE_VARIABLES) | set(AGENT_VARIABLES) | {"PWD", "SHLVL", "_"}
    assert seen["AGENT_TOOL_TOKEN"] == "the-agent-s-own" and seen["LANG"] == "C.UTF-8"
    assert seen["CTU_EPISODE_ID"] == "r0-e0" and "PATH" in seen
    assert seen["OPENAI_API_KEY"] == seen["CTU_EPISODE_TOKEN"] and len(seen["CTU_EPISODE_TOKEN"]) >= 40


def test_what_an_agent_prints_or_plays_is_recorded_redacted(pool, tmp_path):
    from ctu.config.redact import forget, remember

    remember("sk-remembered-secret")  # a key ctu read (an agent.pass_env variable, say)
    try:
        leak = tmp_path / "leak.py"
        leak.write_text("import sys\nprint('key sk-remembered-secret')\nsys.exit(2)\n")
        (trajectory,) = pool(f"{sys.executable} {leak}").run(specs(), SamplingParams(max_tokens=32, seed=0), seed=0)
    finally:
        forget()
    for path in (tmp_path / "agent").rglob("*"):
        if path.is_file():
            assert "sk-remembered-secret" not in path.read_text(), path
    assert "sk-remembered-secret" not in trajectory.error


def test_an_agent_that_exits_0_without_playing_gives_an_errored_episode(pool, tmp_path):
    (trajectory,) = pool(f"{sys.executable} -c \"print('done already')\"").run(
        specs(), SamplingParams(max_tokens=32, seed=0), seed=0)
    assert trajectory.stop_reason == "error" and trajectory.reward == 0.0
    assert trajectory.error.startswith("the agent played nothing: it exited 0 without a chat-completion request")
    log = tmp_path / "agent" / "logs" / "r0-e0.log"
    assert str(log) in trajectory.error and "done already" in log.read_text()
