"""Asynchronous RL and bring-your-own-agent against a real vLLM OpenAI server on CPU (`nox -s vllm_cpu`), each with a
server that ctu launches, health-checks and stops itself: 3 steps at trainer.max_staleness=1 with the parity probe
after every load, and examples/byo_agent/agent.py (the openai SDK only) trained for 3 steps through the server, its
episodes token for token what ctu's own loop records for the ids the server returned."""

import json
import sys

import pytest

from ctu.app.trainer import Trainer
from ctu.engines.vllm.served import ServedEngine
from ctu.observe.tracking import read_metrics
from tests.e2e.test_byo_agent import AGENT, assert_episodes_equal_ctus_own_loop
from tests.e2e.test_train import config, judge  # noqa: F401 - judge: the autouse shaping-judge fixture (respx)

pytestmark = pytest.mark.vllm_cpu


@pytest.fixture(autouse=True)
def local_server_passes(judge):  # noqa: F811 - respx mocks every httpx call; the server is real HTTP
    judge.route(host="127.0.0.1").pass_through()


def served(run_dir, tiny_llama, *extra):
    return config(run_dir, f"model.path={tiny_llama}", "engine.kind=served", "engine.launch=true",
                  "model.dtype=float32", "trainer.eval_before_train=false", "trainer.export=false", "lora.rank=8",
                  "trainer.max_steps=3", *extra)


def returned_ids(monkeypatch) -> list[tuple[int, ...]]:
    """Every completion's ids as the server returned them to the served engine."""
    seen = []
    generate = ServedEngine.generate

    async def recorded(self, prompts, params, seeds=None):
        out = await generate(self, prompts, params, seeds)
        seen.extend(c.token_ids for completions in out for c in completions)
        return out

    monkeypatch.setattr(ServedEngine, "generate", recorded)
    return seen


def test_three_asynchronous_steps_at_staleness_one_with_a_launched_server(tmp_path, tiny_llama, monkeypatch):
    run_dir = tmp_path / "run"
    sampled = returned_ids(monkeypatch)
    trainer = Trainer(served(run_dir, tiny_llama, "trainer.max_staleness=1", "trainer.tis_cap=2.0", "trainer.lr=0.05",
                             "trainer.sft_steps=1", "trainer.sft_lr=0.05", "trainer.sft_batch_size=2"))
    server = trainer.engine.server
    steps = []
    update = trainer.group.update

    def recorded(samples, *args, **kwargs):
        steps.append(trainer.step)
        return update(samples, *args, **kwargs)

    monkeypatch.setattr(trainer.group, "update", recorded)
    trainer.run()
    rows = read_metrics(run_dir)
    print("async steps:", [{k: r[k] for k in ("step", "sync/version", "sync/logprob_max_abs_diff",
                                               "async/staleness_max", "async/dropped_groups")} for r in rows])
    assert [r["step"] for r in rows] == [1, 2, 3] and steps == [1, 2, 3]
    assert [r["sync/version"] for r in rows] == [1.0, 2.0, 3.0]
    for r in rows:
        assert r["sync/logprob_max_abs_diff"] <= 1e-2, r
        assert 0 <= r["async/staleness_mean"] <= r["async/staleness_max"] <= 1, r
    # the worker keeps a step's worth of groups started ahead: step 2 trains on tokens version 0 sampled
    assert any(r["async/staleness_max"] == 1 for r in rows), rows
    assert sampled  # the worker sampled from the real server
    assert server.process.poll() is not None  # stopped with the run


def test_an_openai_sdk_agent_trained_through_a_launched_server(tmp_path, tiny_llama, monkeypatch):
    run_dir = tmp_path / "run"
    sampled = returned_ids(monkeypatch)
    trainer = Trainer(served(run_dir, tiny_llama, "trainer.tasks_per_step=2",
                             "trainer.samples_per_task=1", "trainer.sft_steps=0", "trainer.eval_max_tasks=1",
                             "sampling.max_tokens=12", "env.max_turns=3", "trainer.lr=0.05",
                             f"agent.command={sys.executable} {AGENT}", "agent.concurrency=2", "agent.timeout_s=300"))
    server = trainer.engine.server
    trainer.run()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["sync/version"] for r in rows] == [1.0, 2.0, 3.0]
    assert all(r["rollout/episodes"] == 2 and r["rollout/errored"] == 0 for r in rows), rows
    assert all(r["sync/logprob_max_abs_diff"] <= 1e-2 for r in rows), rows
    assert any(r["train/grad_norm"] > 0 for r in rows)  # shaping made the advantages non-zero: new adapters served
    assert server.process.poll() is not None  # stopped with the run
    recorded = [json.loads(line) for line in (run_dir / "agent" / "episodes.jsonl").read_text().splitlines()]
    assert len(recorded) == 3 * 2 + 1  # three steps of 2 episodes, the final evaluation's one
    assert all(sum(r["loss_mask"]) > 0 and r["extra_samples"] == [] for r in recorded)
    assert_episodes_equal_ctus_own_loop(trainer.config, recorded)
    # policy version v samples step v + 1's rollouts (call v); the final evaluation runs on version 3
    assert all(r["token_versions"] == [r["call"] if m else -1 for m in r["loss_mask"]] for r in recorded)
    spans = [tuple(r["response_ids"][a:b]) for r in recorded for a, b in spans_of(r["loss_mask"])]
    assert spans and all(ids in sampled for ids in spans)  # token-exact: the ids the server returned


def spans_of(mask):
    """[start, end) of each run of 1s in a loss mask: the assistant's sampled turns."""
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out
