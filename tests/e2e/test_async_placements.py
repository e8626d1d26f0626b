"""`trainer.max_staleness=1` on every placement: one producer beside any rollout pool, one staleness rule.

Each run warm-starts (one supervised step: its weights are a version of their own), trains 3 steps of tiny-random on
mini and must record, every step, groups trained with tokens at most one version old and the sync's version, and
tokens sampled while an update ran (the overlap asynchronous RL is for); an evaluation mid-run pauses the producer
(no episode of it is played while the evaluation runs); the producer and everything it started are gone when the run
ends. At k = 0 no placement is wrapped: it is the synchronous loop, whose numbers tests/e2e/test_train_ray.py and
test_train_async.py pin."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from ctu.app.trainer import Trainer
from ctu.observe.tracking import read_metrics
from tests.e2e.test_train import config, judge  # noqa: F401 - judge: the autouse shaping-judge fixture
from tests.fakes import fake_vllm
from tests.fakes.chat_server import StubChatServer

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "examples" / "byo_agent" / "agent.py"
K1 = ("trainer.max_staleness=1", "trainer.tis_cap=2.0")


@pytest.fixture(autouse=True)
def slow_update(monkeypatch):
    """Each update's sync starts 0.3 s late (a slower trainer): the groups the producer may run meanwhile are
    sampling while it waits, on any machine."""
    from ctu.train.sync import WeightSync

    real = WeightSync.after_update
    monkeypatch.setattr(WeightSync, "after_update", lambda self, version: (time.sleep(0.3), real(self, version))[1])


@pytest.fixture(autouse=True)
def slow_user(judge):  # noqa: F811
    """The user simulator behind an API that answers in 0.5 s (real HTTP on loopback, reached from Ray workers and
    agent programs too): a group outlasts the trainer's work between taking its groups and updating on any machine,
    so the next step's groups are sampling while the update runs. With the tiny model's instant scripted replies
    every group could end before the update began (seen: no overlap on all 3 steps of a Ray run)."""
    judge.route(host="127.0.0.1").pass_through()
    with StubChatServer(delay=0.5) as user:
        USER[:] = ["user.kind=llm", f"user.base_url={user.base_url}"]
        yield user


USER: list[str] = []


def run_k(run_dir, *extra, steps=3):
    trainer = Trainer(config(run_dir, *USER, f"trainer.max_steps={steps}", "trainer.eval_before_train=false",
                             "trainer.export=false", "trainer.eval_max_tasks=1", "trainer.eval_interval=2",
                             "trainer.sft_steps=1", *K1, *extra))
    trainer.run()
    return trainer, read_metrics(run_dir)


def check_async_rows(rows, steps=3):
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert any(k.startswith("eval/") for k in rows[1])  # the evaluation mid-run
    for r in rows:
        assert r["rollout/trained_groups"] == 2 and r["sync/version"] == r["step"]
        assert 0 <= r["async/staleness_mean"] <= r["async/staleness_max"] <= 1
        assert r["rollout/errored"] == 0
    assert all(r["async/update_tokens"] >= 0 for r in rows)
    assert sum(r["async/update_generating_s"] for r in rows) > 0  # generation ran while the trainer updated


def no_producer_left():
    return not [t for t in threading.enumerate() if t.name == "ctu-rollout-producer" and t.is_alive()]


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_the_agent_plays_the_training_episodes_and_an_evaluation_waits_for_its_groups(tmp_path, cpu_only, monkeypatch):
    """agent.command with k = 1: the agent pool is the producer; every trained episode is one the agent played; an
    evaluation starts only when none of the agent's groups runs, and no group starts during one."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    from ctu.distributed.agent_pool import AgentPool

    spans, running = [], []
    real_run = AgentPool.run

    def logged(self, specs, params, seed, judge_enabled=False, on_done=None):
        kind = "eval" if params.temperature == 0.0 or judge_enabled else "train"
        running.append(kind)
        spans.append(("start", kind, tuple(running)))
        try:
            return real_run(self, specs, params, seed, judge_enabled, on_done)
        finally:
            running.remove(kind)

    monkeypatch.setattr(AgentPool, "run", logged)
    run_dir = tmp_path / "run"
    trainer, rows = run_k(run_dir, f"agent.command={sys.executable} {AGENT}", "agent.concurrency=4",
                          "agent.timeout_s=120", "sampling.max_tokens=12", "eval.temperature=0.0")
    check_async_rows(rows)
    played = [json.loads(line) for line in (run_dir / "agent" / "episodes.jsonl").read_text().splitlines()]
    # the agent's rows: 3 steps x 2 groups x 2 episodes trained at least, + 2 evaluations of 1 episode
    assert len(played) >= 3 * 4 + 2, len(played)
    assert len({row["call"] for row in played}) >= 6 + 2  # a call per group, one per evaluation
    evals = [s for s in spans if s[1] == "eval"]
    assert evals and all(s[2] == ("eval",) for s in evals)  # nothing else ran when an evaluation started
    assert all("eval" not in s[2] for s in spans if s[1] == "train")  # and no group started during one
    assert no_producer_left()


@pytest.mark.parametrize("mode", ["merged", "adapter"])
def test_in_process_vllm(tmp_path, cpu_only, monkeypatch, mode):
    """vLLM without sleep mode (its CPU build) keeps its memory: it generates through every update. With LoRA it
    takes each version as an adapter of its own (the warm start's is not the base's)."""
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm, "SLEEP_MODE", False)
    _, rows = run_k(tmp_path / "run", "engine.kind=vllm", "model.dtype=float32", f"engine.weight_sync={mode}")
    check_async_rows(rows)
    assert no_producer_left()


def test_an_engine_that_sleeps_to_free_the_gpu_is_refused_in_one_line(tmp_path, cpu_only, monkeypatch):
    """vLLM's sleep mode (a GPU shared with the trainer, engine.colocated=true) frees its memory through every
    update: nothing could overlap one, so asynchronous RL is refused before any work."""
    from ctu.config.schema import ConfigError

    fake_vllm.install(monkeypatch)
    with pytest.raises(ConfigError, match=r"^trainer.max_staleness=1: the rollout engine sleeps .*engine.colocated=true"):
        run_k(tmp_path / "run", "engine.kind=vllm", "model.dtype=float32")
    assert no_producer_left()


def test_an_engine_that_keeps_its_old_weights_stops_the_run(tmp_path, cpu_only, monkeypatch):
    """The producer's hf engine (a copy of the policy) stamps the new version but loads nothing: its own
    fingerprint stops the run at the first sync that changed the weights (the warm start's, version 0)."""
    from ctu.engines.checks.parity import ParityError
    from ctu.engines.hf.engine import HFEngine

    monkeypatch.setattr(HFEngine, "update_weights",
                        lambda self, named_tensors, version=None: (list(named_tensors), setattr(self, "weights_version", version)))
    monkeypatch.setattr("ctu.train.sync.check_parity", lambda diff, tolerance: None)  # the probe alone would catch it
    with pytest.raises(ParityError, match=r"engine 0 acknowledged the weights of version 0 but holds other ones"):
        run_k(tmp_path / "run", steps=1)


@pytest.mark.parametrize("mode", ["abort", "continue"])
def test_partial_rollouts_keep_the_staleness_bound(tmp_path, cpu_only, monkeypatch, mode):
    """The in-process hf engine (the quickstart's placement). trainer.inflight=abort|continue: a load stops the
    producer's generation calls at a token boundary (the engine's own test pins the tokens and logprobs); the run
    trains as before, every token within k versions. Here the engine decodes a token each 30 ms and, from the moment
    a step has taken its groups until its load is pending (up to 30 s), holds each decode step at its token
    boundary (not a call's start, where a load stops nothing): the next step's groups cannot finish before the update
    ends on a machine of any speed or load (seen on a busy CI machine before: no row in flight at either load). finish (the
    default: the call ends first, nothing is stopped) is pinned by the engine's test and, in the loop at k = 1, by
    tests/e2e/test_train_async.py."""
    from ctu.app.async_loop import AsyncRollouts
    from ctu.engines.hf.engine import HFEngine

    hold, engines = threading.Event(), []

    def pace(share):
        time.sleep(0.03)
        if sys._getframe(1).f_code.co_name != "_generate_batch":  # a call's start: a load then stops nothing
            return
        deadline = time.monotonic() + 30
        while hold.is_set() and not any(e._pending_loads for e in engines) and time.monotonic() < deadline:
            time.sleep(0.002)

    real_collect, real_update = AsyncRollouts.collect, HFEngine.update_weights

    def collect(self):
        out = real_collect(self)
        if self.trainer.step < self.trainer.config.trainer.max_steps:  # the last step stops the producer instead
            hold.set()
        return out

    def update_weights(self, named_tensors, version=None):
        if self not in engines:
            engines.append(self)
        try:
            return real_update(self, named_tensors, version)
        finally:
            hold.clear()

    monkeypatch.setattr("ctu.engines.cpu.cpu_share.pace", pace)
    # the CPU-sharing probe (on a busy machine) is a generation call of its own, never stopped: not this test's
    monkeypatch.setattr("ctu.engines.cpu.cpu_threads.due", lambda kind: False)
    monkeypatch.setattr(AsyncRollouts, "collect", collect)
    monkeypatch.setattr(HFEngine, "update_weights", update_weights)
    _, rows = run_k(tmp_path / "run", f"trainer.inflight={mode}", "sampling.max_tokens=32")
    check_async_rows(rows)
    assert sum(r["async/interrupted_rows"] for r in rows) > 0  # a load stopped rows the producer was sampling
