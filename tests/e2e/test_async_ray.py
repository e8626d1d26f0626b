"""`trainer.max_staleness=1` on the Ray placements: rollout workers (with and without an agent program) and FSDP2
trainer ranks, under the rules tests/e2e/test_async_placements.py states (a file of their own: each takes 1-2 minutes
on 2 cores, and a test file is what one xdist worker runs at a time)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.e2e.test_async_placements import (  # noqa: F401 - cpu_only, slow_update, slow_user: fixtures
    AGENT,
    check_async_rows,
    cpu_only,
    no_producer_left,
    run_k,
    slow_update,
    slow_user,
)
from tests.e2e.test_train import judge  # noqa: F401 - the autouse shaping-judge fixture slow_user takes

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("cpu_only")]


def test_ray_rollout_workers_keep_producing(tmp_path, cluster):
    _, rows = run_k(tmp_path / "run", "distributed.rollout_workers=1", "distributed.worker_cpus=0.5")
    check_async_rows(rows)
    assert no_producer_left()


def test_the_agent_plays_on_a_ray_rollout_worker(tmp_path, cluster):
    """agent.command with distributed.rollout_workers=1: the worker's agent pool plays every episode (training
    groups and evaluations), its rows in the run's agent/episodes.jsonl named by the worker."""
    run_dir = tmp_path / "run"
    _, rows = run_k(run_dir, "distributed.rollout_workers=1", "distributed.worker_cpus=0.5",
                    f"agent.command={sys.executable} {AGENT}", "agent.concurrency=4", "agent.timeout_s=120",
                    "sampling.max_tokens=12")
    check_async_rows(rows)
    played = [json.loads(line) for line in (run_dir / "agent" / "episodes.jsonl").read_text().splitlines()]
    assert len(played) >= 3 * 4 + 2, len(played)
    assert all(row["episode_id"].startswith("w0-") for row in played)
    assert no_producer_left()


def test_fsdp2_trainer_ranks(tmp_path, cluster):
    _, rows = run_k(tmp_path / "run", "distributed.trainer_workers=2", "distributed.trainer_cpus=0.5",
                    "trainer.autocast=off")
    check_async_rows(rows)
    assert no_producer_left()
