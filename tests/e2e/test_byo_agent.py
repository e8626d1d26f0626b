"""Bring your own agent, end to end: `ctu train` trains examples/byo_agent/agent.py (the openai SDK only, no ctu
import) for 3 steps on mini with tiny-random, and every episode it played is token for token what ctu's own loop
records when the engine samples the same ids."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctu.config.schema import load_config
from ctu.distributed.pool import limits_of
from ctu.domains import get_domain
from ctu.engines.base import Completion, Engine
from ctu.episode.users.scripted import ScriptedUser
from ctu.observe.tracking import read_metrics
from ctu.rollout import components as build
from ctu.rollout.loop import EpisodeSpec, rollout

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "examples" / "byo_agent" / "agent.py"


class ReplayEngine(Engine):
    """Answers a prompt with the ids (and logprobs) the agent's run sampled after exactly that prompt; a prompt the
    run never sent raises, so ctu's loop must build the same prompts to get through."""

    def __init__(self, answers, stop_ids):
        self.answers, self.stop_ids = answers, stop_ids

    async def generate(self, prompts, params, seeds=None):
        out = []
        for prompt in prompts:
            ids, logprobs = self.answers[tuple(prompt)]
            out.append([Completion(tuple(ids), tuple(logprobs), "stop" if ids and ids[-1] in self.stop_ids else "length")])
        return out

    def update_weights(self, named_tensors, version=None):
        raise NotImplementedError


def answers_of(row):
    """prompt -> (sampled ids, logprobs) for each assistant turn of a recorded trajectory."""
    prompt, response, mask, logprobs = row["prompt_ids"], row["response_ids"], row["loss_mask"], row["logprobs"]
    out, start = {}, None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out[tuple(prompt + response[:start])] = (response[start:i], logprobs[start:i])
            start = None
    return out


def without_call_ids(messages):
    return [{k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")} for m in messages]


@pytest.mark.slow  # about 70 s on 2 busy CPU cores: 7 agent processes, 3 updates of tiny-random
def test_ctu_train_trains_an_openai_sdk_agent_and_its_episodes_equal_ctus_own_loop(tmp_path):
    run_dir = tmp_path / "run"
    overrides = ["model.path=tiny-random", f"run.dir={run_dir}", "trainer.max_steps=3", "trainer.tasks_per_step=2",
                 "trainer.samples_per_task=1", "trainer.sft_steps=0", "trainer.eval_before_train=false",
                 "trainer.eval_max_tasks=1", "trainer.export=false", "sampling.max_tokens=12", "env.max_turns=3",
                 "trainer.lr=1e-3", f"agent.command={sys.executable} {AGENT}", "agent.concurrency=2",
                 "agent.timeout_s=120"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "ctu", "train", "configs/quickstart.yaml", *overrides], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/episodes"] == 2 and r["rollout/errored"] == 0 for r in rows)
    assert all("train/loss" in r for r in rows)
    recorded = [json.loads(line) for line in (run_dir / "agent" / "episodes.jsonl").read_text().splitlines()]
    assert len(recorded) == 3 * 2 + 1  # three steps of 2 episodes, the final evaluation's one
    assert all(sum(r["loss_mask"]) > 0 and r["extra_samples"] == [] for r in recorded)
    assert not list((run_dir / "agent" / "logs").iterdir())  # logs are kept only for failed agents

    assert_episodes_equal_ctus_own_loop(load_config("configs/quickstart.yaml", overrides), recorded)
    # policy version v samples step v + 1's rollouts (call v); the final evaluation runs on version 3
    assert all(r["token_versions"] == [r["call"] if m else -1 for m in r["loss_mask"]] for r in recorded)


def assert_episodes_equal_ctus_own_loop(config, recorded):
    """Each episode the agent played (a row of <run.dir>/agent/episodes.jsonl) is, token for token, what ctu's own
    rollout loop records when the engine samples the same ids after the same prompts."""
    chat = build.build_chat(config)
    domain = get_domain("mini")
    params = build.sampling_params(config)
    for row in recorded:
        engine = ReplayEngine(answers_of(row), chat.stop_token_ids)
        (ours,) = asyncio.run(rollout([EpisodeSpec(domain, domain.task(row["task_id"]), row["sample"])], chat, engine,
                                      ScriptedUser(patience=config.user.patience), params, limits_of(config)))
        for key in ("prompt_ids", "response_ids", "loss_mask", "reward", "stop_reason", "termination", "turns"):
            assert getattr(ours, key) == row[key], (key, row["episode_id"])
        assert ours.logprobs == row["logprobs"]
        assert without_call_ids(ours.messages) == without_call_ids(row["messages"])
