"""The production topology in one process tree, on fakes only where hardware is needed: 2 FSDP2 trainer ranks (gloo),
1 Ray rollout worker whose agent pool runs the example agent (the openai SDK) against a served engine, a vLLM server
(the fake: real HTTP, vLLM 0.33's LoRA hot-load routes) taking each version as an adapter, trainer.max_staleness=1.
`nox -s topology` runs the same with the real vLLM CPU server (tests/vllm_cpu/test_topology_cpu.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from ctu.app.trainer import Trainer
from ctu.observe.tracking import read_metrics
from tests.e2e.test_train import config, judge  # noqa: F401 - judge: the autouse shaping-judge fixture (respx)
from tests.fakes.fake_vllm_server import FakeVLLMServer
from tests.vllm_cpu.test_async_agent_cpu import spans_of

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "examples" / "byo_agent" / "agent.py"
pytestmark = pytest.mark.ray


@pytest.fixture(autouse=True)
def local_server_passes(judge):  # noqa: F811 - respx mocks every httpx call; the fake server is real HTTP
    judge.route(host="127.0.0.1").pass_through()



def topology(run_dir, *extra):
    """2 FSDP2 ranks + 1 Ray rollout worker playing the example agent through a served engine (``extra`` says which
    server), k = 1, 3 steps."""
    return config(run_dir, "engine.kind=served", "model.dtype=float32",
                  "distributed.trainer_workers=2", "distributed.trainer_cpus=0.5", "trainer.autocast=off",
                  "distributed.rollout_workers=1", "distributed.worker_cpus=0.5",
                  f"agent.command={sys.executable} {AGENT}", "agent.concurrency=4", "agent.timeout_s=120",
                  "trainer.max_staleness=1", "trainer.tis_cap=2.0", "trainer.max_steps=3", "trainer.sft_steps=1",
                  "trainer.eval_before_train=false", "trainer.eval_max_tasks=1", "trainer.eval_interval=2",
                  "trainer.export=false", "trainer.lr=0.05", "sampling.max_tokens=12", *extra)


def test_the_whole_topology_trains_three_asynchronous_steps(tmp_path, cluster, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run_dir = tmp_path / "run"
    with FakeVLLMServer() as fake:
        Trainer(topology(run_dir, f"engine.base_url={fake.url}/v1")).run()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["sync/version"] == r["step"] and r["sync/logprob_max_abs_diff"] <= 1e-3, r
        assert 0 <= r["async/staleness_mean"] <= r["async/staleness_max"] <= 1, r
        assert r["rollout/errored"] == 0 and r["rollout/trained_groups"] == 2, r
    loads = [e.split("/")[0].rstrip() for e in fake.events if e.startswith(("load", "unload"))]
    assert [e for e in loads if e.startswith("load")] == [f"load ctu-v{v}" for v in range(4)], loads
    assert any(r["train/grad_norm"] > 0 for r in rows)  # new adapters every step, not the same one re-sent
    played = [json.loads(line) for line in (run_dir / "agent" / "episodes.jsonl").read_text().splitlines()]
    assert len(played) >= 3 * 4 + 1 and all(row["episode_id"].startswith("w0-") for row in played)
    returned = {tuple(ids) for ids in fake.returned}
    for row in played:  # the agent's trained tokens are the ids the server returned (no re-tokenization)
        assert row["stop_reason"] != "error", row.get("error")
        spans = [tuple(row["response_ids"][a:b]) for a, b in spans_of(row["loss_mask"])]
        assert spans and all(span in returned for span in spans), row["episode_id"]

