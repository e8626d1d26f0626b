"""`ctu train` with Ray rollout workers is the same loop with the same numbers: in-process and 2 Ray rollout
workers give the same per-step rewards, sampled and trained tokens, and losses / gradient norms within a relative
1e-4 (fp32, CPU, tiny-random, a local Ray cluster with 2 CPUs)."""

import os

import pytest
import torch

from ctu.tracking import read_metrics
from ctu.train.trainer import Trainer
from tests.e2e.test_train import config, judge  # noqa: F401 - judge: the autouse shaping-judge fixture

EXACT = ("rollout/reward", "rollout/shaped_reward", "rollout/response_tokens", "rollout/episodes",
         "rollout/trained_episodes", "train/trained_tokens", "train/updates", "sync/version")
CLOSE = ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy", "train/clip_fraction")


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="Ray rollout workers need the distributed extra: "
                                            "pip install 'ctu[distributed]'")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield
    ray.shutdown()


def run(run_dir, *extra):
    torch.manual_seed(0)
    Trainer(config(run_dir, "trainer.max_steps=3", "trainer.eval_before_train=false", "trainer.export=false",
                   "trainer.eval_max_tasks=2", *extra)).run()
    return read_metrics(run_dir)


def test_in_process_and_two_ray_workers_give_the_same_numbers(tmp_path, cluster, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    local = run(tmp_path / "local")
    ray_rows = run(tmp_path / "ray", "distributed.rollout_workers=2", "distributed.worker_cpus=0.5")
    assert [r["step"] for r in ray_rows] == [1, 2, 3]
    assert any(r["train/grad_norm"] > 0 for r in local)  # the policy really changed between steps
    for a, b in zip(local, ray_rows, strict=True):
        for key in EXACT:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
        for key in CLOSE:
            assert abs(a[key] - b[key]) <= 1e-4 * max(abs(a[key]), abs(b[key]), 1e-3), (a["step"], key, a[key], b[key])
        assert b["sync/logprob_max_abs_diff"] <= 1e-3  # every worker passed the parity probe on the new weights
