"""The LLM user, the judge and judge shaping against a real OpenAI-compatible server (``transformers serve``
on 127.0.0.1, see tests/support/real_server.py): every strategy, several training steps, a server killed mid-eval and
restarted, a server that never comes back.

One server is started for the module (~15 s on 2 busy cores) and restarted once; the tests run in file order
and the last one kills it for good.
"""

import asyncio
import json
import logging
import threading
import time

import httpx
import pytest

from ctu.app.cli import main
from ctu.app.trainer import Trainer
from ctu.config.schema import load_config
from ctu.domains import get_domain
from ctu.engines.base import Completion, Engine, SamplingParams
from ctu.engines.vllm.remote import RemoteEngine, RemoteEngineError
from ctu.episode.judge import JudgeError, LLMJudge
from ctu.episode.llm_api import ChatAPIConfig, ChatClient, LLMCallError
from ctu.episode.users.llm import LLMUser, LLMUserConfig
from ctu.observe.tracking import read_metrics
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout
from tests.support.real_server import TransformersServer, protocol_model, serving_available
from tests.support.toy_domain import make_toy_domain

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not serving_available(), reason="needs transformers[serving] (FastAPI, uvicorn)")]

SCAFFOLDING = ("Thought:", "Reflection:", "User Response:", "Response:", "<the corrected customer reply>")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-server")
    srv = TransformersServer(protocol_model(root / "model"), root)
    srv.startup_s = srv.start()
    yield srv
    srv.kill()


class AskingAgent(Engine):
    """The agent side, which these tests are not about: every turn asks the customer for more (ends its turn)."""

    def __init__(self, chat):
        self.ids = tuple(chat.encode("Could you tell me more about that?") + [chat.stop_token_ids[0]])

    async def generate(self, prompts, params, seeds=None):
        return [[Completion(self.ids, (-0.1,) * len(self.ids), "stop")] for _ in prompts]

    def update_weights(self, named_tensors):
        raise NotImplementedError


@pytest.fixture(scope="module")
def agent(chat_format):
    return chat_format, AskingAgent(chat_format)


def user_config(server, **kw):
    return LLMUserConfig(model=server.model, base_url=server.base_url, api_key_env="CTU_TEST_NO_KEY",
                         max_tokens=12, **kw)


class Spy:
    """Records each completion the session asked for (messages, text), passing every call to the real server."""

    def __init__(self, client):
        self.client, self.calls = client, []
        self.complete_real = client.complete

    async def complete(self, messages, **kw):
        text = await self.complete_real(messages, **kw)
        self.calls.append((list(messages), text))
        return text


def play(chat, engine, user, specs, judge=None):
    params = SamplingParams(temperature=0.0, max_tokens=8, seed=0)
    return asyncio.run(rollout(specs, chat, engine, user, params, RolloutLimits(max_turns=3), judge=judge))


def test_one_user_client_across_per_step_event_loops_never_needs_a_retry(server):
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    client = ChatClient(ChatAPIConfig(model=server.model, base_url=server.base_url), sleep=sleep)
    texts = [asyncio.run(client.complete([{"role": "user", "content": "hi"}], max_tokens=4)) for _ in range(3)]
    assert len(set(texts)) == 1 and texts[0].strip()  # greedy: the same reply each time
    assert slept == [], slept  # was: a retry in every loop from the 2nd on ("Event loop is closed")
    assert client.failures == []



def test_a_refused_request_carries_the_servers_reason(server):
    client = ChatClient(ChatAPIConfig(model="gpt-4.1-mini", base_url=server.base_url))
    with pytest.raises(LLMCallError) as err:
        asyncio.run(client.complete([{"role": "user", "content": "hi"}], max_tokens=4))
    text = str(err.value)
    assert "HTTP 400" in text and "not retried" in text and "requested 'gpt-4.1-mini'" in text, text
    assert "Server is pinned to" in text and len(client.failures) == 1

@pytest.mark.parametrize("strategy", ["llm", "react", "verify", "reflection"])
def test_every_user_strategy_plays_episodes_and_sends_only_customer_messages(server, agent, strategy):
    chat, engine = agent
    mini = get_domain("mini")
    user = LLMUser(user_config(server, strategy=strategy, temperature=0.0))
    spy = Spy(user.client)
    user.client.complete = spy.complete
    specs = [EpisodeSpec(mini, task) for task in mini.split("test")[:2]]
    for _ in range(2):  # two event loops, as two training steps
        trajectories = play(chat, engine, user, specs)
        assert [t.stop_reason for t in trajectories] == ["max_turns"] * 2, [t.error for t in trajectories]
    generated = {text.strip() for messages, text in spy.calls if messages[0]["role"] == "system"}
    sent = [m["content"] for t in trajectories for m in t.messages if m["role"] == "user"]
    assert len(sent) >= 2 * 2
    for text in sent:
        assert not any(s in text for s in SCAFFOLDING), text
        if strategy != "react":
            assert text in generated, text  # a generation's reply, never a verify verdict or a reflection
    if strategy in ("verify", "reflection"):  # the tiny model never answers "true": every reply is regenerated
        regenerations = [(m, t) for m, t in spy.calls if m[0]["role"] == "system" and "rejected" in m[-1]["content"]]
        assert regenerations
        for messages, text in regenerations:  # at temperature 0 a regeneration still differs from what it replaces
            assert text.strip() != messages[-2]["content"].strip()
    assert user.client.failures == []


def test_judge_against_the_real_server_errors_the_episode_never_scores_it_0(server, agent):
    chat, engine = agent
    toy = make_toy_domain()
    judge = LLMJudge(ChatAPIConfig(model=server.model, base_url=server.base_url), max_tokens=16)
    with pytest.raises(JudgeError, match=r"judge reply is not 1 verdict"):
        asyncio.run(judge.judge(["Agent is polite."], [{"role": "assistant", "content": "Hello"}]))
    (trajectory,) = play(chat, engine, LLMUser(user_config(server)), [EpisodeSpec(toy, toy.task("judged"))],
                         judge=judge)
    assert trajectory.stop_reason == "error" and trajectory.error.startswith("judge: judge reply is not 1 verdict")
    assert judge.client.failures == []


def test_training_steps_with_the_llm_user_and_shaping_on_the_server(server, tmp_path):
    base = [f"user.model={server.model}", f"user.base_url={server.base_url}", "user.max_tokens=8"]
    config = load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={tmp_path / 'run'}", "trainer.max_steps=3", "trainer.tasks_per_step=2",
        "trainer.samples_per_task=2", "trainer.sft_steps=0", "trainer.eval_before_train=false",
        "trainer.eval_max_tasks=2", "trainer.export=false", "sampling.max_tokens=8", "env.max_turns=2",
        "user.kind=llm", *base, "shaping.enabled=true", *[b.replace("user.", "shaping.") for b in base]])
    trainer = Trainer(config)
    trainer.run()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r.get("rollout/errored", 0) == 0 for r in rows), rows
    assert trainer.user.client.failures == [] and trainer.shaper.client.failures == []


def test_the_remote_engine_needs_what_transformers_serve_lacks(server):
    """ctu's remote engine sends token ids and reads per-token ids and logprobs (vLLM's /v1/completions); this
    server refuses vLLM's fields, takes only text prompts and returns no logprobs. If that changes, so must README."""
    engine = RemoteEngine(server.base_url, server.model, api_key_env="CTU_TEST_NO_KEY", max_retries=0)
    with pytest.raises(RemoteEngineError, match=r"HTTP 422: .*Unexpected fields.*return_tokens_as_token_ids"):
        asyncio.run(engine.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=4, seed=0)))
    url = f"{server.base_url}/completions"
    ids = httpx.post(url, json={"model": server.model, "prompt": [1, 2, 3], "max_tokens": 4}, timeout=60)
    assert ids.status_code == 400 and "prompt must be a string" in ids.text
    text = httpx.post(url, json={"model": server.model, "prompt": "Hello", "max_tokens": 4, "logprobs": 1}, timeout=60)
    assert text.status_code == 200 and "logprobs" not in text.json()["choices"][0]


def eval_args(server, run_dir, *extra):
    return ["eval", "configs/quickstart.yaml", "model.path=tiny-random", f"run.dir={run_dir}",
            "env.domains=[mini]", "eval.max_tasks=12", "eval.concurrency=12", "env.max_turns=4",
            "sampling.max_tokens=8", "user.kind=llm", f"user.model={server.model}", f"user.base_url={server.base_url}",
            "user.max_tokens=8", *extra]


def run_in_thread(args):
    out = {}

    def target():
        out["rc"] = main(args)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


def wait_for_requests(server, n, timeout=120.0):
    deadline = time.monotonic() + timeout
    while server.requests() < n:
        assert time.monotonic() < deadline, f"server answered {server.requests()} requests, wanted {n}"
        time.sleep(0.05)


def test_a_server_killed_mid_eval_and_restarted_the_run_finishes_and_nothing_is_scored_0(server, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ctu.episode.llm_api")
    run_dir = tmp_path / "restart"
    thread, out = run_in_thread(eval_args(server, run_dir))  # the default retry budget (40-80 s)
    wait_for_requests(server, 3)  # each episode asks the user once (the tiny agent's turn ends at max_tokens)
    server.kill()
    down = time.monotonic()
    restart_s = server.start()
    thread.join(timeout=300)
    assert not thread.is_alive() and out.get("rc") == 0, out
    rows = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    report = json.loads((run_dir / "report.json").read_text())["overall"]
    assert len(rows) == 12 and report["errored"] == sum(r["stop_reason"] == "error" for r in rows) == 0
    assert server.requests() > 0  # the eval went on against the restarted server
    retried = [r.getMessage() for r in caplog.records if "failed (APIConnectionError" in r.getMessage()]
    assert retried, "no request was in flight when the server died"
    print(f"server down {time.monotonic() - down:.1f} s (restart {restart_s:.1f} s); {len(retried)} retried attempts")


def test_a_server_that_never_comes_back_ends_the_eval_with_one_line(server, tmp_path, capsys):
    run_dir = tmp_path / "gone"
    budget = ["user.max_retries=3", "user.backoff_initial=0.5", "user.backoff_max=1"]  # waits 1.25-2.5 s in all
    server.kill()  # it dies as the eval starts and never comes back
    thread, out = run_in_thread(eval_args(server, run_dir, *budget))
    killed = time.monotonic()
    thread.join(timeout=120)
    waited = time.monotonic() - killed
    assert not thread.is_alive() and out.get("rc") == 1, out
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ctu: error:")]
    assert len(errors) == 1, errors
    message = errors[0]
    assert message.startswith("ctu: error: no episode could be scored: all 12 episode(s) errored (first error: "
                              "user simulator: model ") and "\n" not in message
    assert "failed after 4 attempts (last error: APIConnectionError (ConnectError" in message
    assert waited < 60, waited  # bounded: the budget (2.5 s) plus the agent's turns, not a hang
    report = json.loads((run_dir / "report.json").read_text())["overall"]
    assert report["episodes"] == report["errored"] == 12

