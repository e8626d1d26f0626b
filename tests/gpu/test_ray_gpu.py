"""A Ray run on one GPU, colocated: 1 FSDP2 trainer rank (NCCL) and 1 rollout worker with the hf engine share the
GPU's placement bundle; 2 steps of `ctu train` on a random model with a real vocabulary; every sync passes the
parity probe and the weight-version check, and the steps' numbers equal the in-process run's. The model's weights
are 15x HF's default scale and the learning rate 1e-2, so what it samples depends on its weights and step 1's
update changes step 2's rollouts (a near-uniform random model samples the same rewards and token counts whatever
its weights); the loss, gradient norm and entropy depend on the weights too."""

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_ray_one_gpu_colocated_two_steps(tmp_path):
    ray = pytest.importorskip("ray", reason="needs the distributed extra")
    from ctu.app.trainer import Trainer
    from ctu.observe.tracking import read_metrics
    from tests.e2e.test_train import config
    from tests.support.models import save_random_model

    model = save_random_model(tmp_path / "model", arch="qwen2", layers=2, hidden=256, vocab_size=151_936,
                              initializer_range=0.3)

    def run(run_dir, *extra):
        torch.manual_seed(0)
        cfg = config(run_dir, f"model.path={model}", "trainer.max_steps=2", "trainer.eval_before_train=false",
                     "trainer.export=false", "trainer.eval_max_tasks=2", "shaping.enabled=false",
                     "model.dtype=float32", "trainer.lr=1e-2", *extra)
        Trainer(cfg).run()
        return read_metrics(run_dir)

    local = run(tmp_path / "local")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        rows = run(tmp_path / "ray", "distributed.trainer_workers=1", "distributed.rollout_workers=1",
                   "distributed.placement=colocated")
    finally:
        ray.shutdown()
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["sync/version"] for r in rows] == [1.0, 2.0]  # checked against every worker's stamp at each sync
    for a, b in zip(local, rows, strict=True):
        for key in ("rollout/reward", "rollout/episodes", "train/trained_tokens"):
            assert a[key] == b[key], (key, a[key], b[key])
        for key in ("train/loss", "train/grad_norm", "train/entropy"):  # these depend on the weights
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-6), (key, a[key], b[key])
        assert b["sync/logprob_max_abs_diff"] <= 1e-2
