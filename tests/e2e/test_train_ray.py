"""`ctu train` on Ray is the same loop with the same numbers: in-process, 2 Ray rollout workers, Ray 1 trainer rank
+ 1 rollout worker and Ray 2 FSDP2 trainer ranks + 2 rollout workers give the same per-step rewards, sampled and
trained tokens, and losses / gradient norms within a relative 1e-4 (CPU, tiny-random, a local Ray cluster with 2
CPUs). The quickstart's ``trainer.autocast: bfloat16`` (bf16 matmuls over fp32 weights) holds on a Ray trainer rank
as in one process (a rank that trained in fp32 was 2.7e-3 off in grad norm); across 2 FSDP2 ranks each rank's
partial weight gradients are rounded to bf16 before the sum, so that comparison runs in fp32 (``autocast=off``). A trainer rank killed mid-step stops the run with a one-line reason, and ``trainer.resume=latest``
continues from the last complete checkpoint with the metrics of an uninterrupted run."""


import pytest
import torch

from ctu.app.trainer import Trainer
from ctu.observe.tracking import read_metrics
from tests.e2e.test_train import config, judge  # noqa: F401 - judge: the autouse shaping-judge fixture

EXACT = ("rollout/reward", "rollout/shaped_reward", "rollout/response_tokens", "rollout/episodes",
         "rollout/trained_episodes", "train/trained_tokens", "train/updates", "sync/version")
CLOSE = ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy", "train/clip_fraction")



FP32 = "trainer.autocast=off"
pytestmark = pytest.mark.ray


def run(run_dir, *extra):
    """``sampling.top_k=20``: the random model's next-token distribution is nearly flat over 49,152 tokens, and where
    a CPU's kernels round a row's logits differently at another batch size (AVX2: 2 episodes a Ray worker against 4
    in one process, 1e-6 apart), one uniform a row over the whole vocabulary's running sum lands on a neighbouring
    token every few hundred draws (every later boundary moves). Over 20 candidates the same rounding moves 20."""
    torch.manual_seed(0)
    Trainer(config(run_dir, "trainer.max_steps=3", "trainer.eval_before_train=false", "trainer.export=false",
                   "trainer.eval_max_tasks=2", "sampling.top_k=20", *extra)).run()
    return read_metrics(run_dir)


def same_numbers(local, other):
    assert [r["step"] for r in other] == [r["step"] for r in local]
    for a, b in zip(local, other, strict=True):
        for key in EXACT:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
        for key in CLOSE:
            assert abs(a[key] - b[key]) <= 1e-4 * max(abs(a[key]), abs(b[key]), 1e-3), (a["step"], key, a[key], b[key])
        assert b["sync/logprob_max_abs_diff"] <= 1e-3  # every worker passed the parity probe on the new weights


_LOCAL: dict = {}


@pytest.fixture
def local_runs(tmp_path_factory, cluster, monkeypatch):
    """The in-process runs, once per module and precision (under each test's shaping-judge mock)."""
    def get(*extra):
        if extra not in _LOCAL:
            monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
            _LOCAL[extra] = run(tmp_path_factory.mktemp("local") / "run", *extra)
        return _LOCAL[extra]
    return get


@pytest.fixture
def local_rows(local_runs):
    return local_runs()


def test_in_process_and_two_ray_workers_give_the_same_numbers(tmp_path, local_rows, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ray_rows = run(tmp_path / "ray", "distributed.rollout_workers=2", "distributed.worker_cpus=0.5")
    assert [r["step"] for r in ray_rows] == [1, 2, 3]
    assert any(r["train/grad_norm"] > 0 for r in local_rows)  # the policy really changed between steps
    same_numbers(local_rows, ray_rows)


@pytest.mark.parametrize("trainers,workers,placement,precision", [(1, 1, "split", ()), (2, 2, "colocated", (FP32,))])
def test_ray_trainer_ranks_give_the_in_process_numbers(tmp_path, local_runs, monkeypatch, trainers, workers,
                                                         placement, precision):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rows = run(tmp_path / "ray", f"distributed.trainer_workers={trainers}", f"distributed.rollout_workers={workers}",
               f"distributed.placement={placement}", "distributed.worker_cpus=0.5", "distributed.trainer_cpus=0.5",
               *precision)
    same_numbers(local_runs(*precision), rows)


def test_a_dead_trainer_rank_stops_the_run_and_resume_continues_with_the_same_numbers(tmp_path, local_runs,
                                                                                         monkeypatch):
    from ctu.app import trainer as trainer_module
    from ctu.distributed.group import TrainerRankError
    from ctu.distributed.ray_trainer import RayTrainerGroup

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fault = tmp_path / "fault"
    fault.write_text("2")  # rank 1 dies in its 2nd update (step 2), after step 1's checkpoint
    extra = ("distributed.trainer_workers=2", "distributed.trainer_cpus=0.5", FP32)  # rollouts in process: cheaper
    with monkeypatch.context() as m:
        m.setattr(trainer_module, "build_trainer_group", lambda cfg: RayTrainerGroup(cfg, fault_files={1: str(fault)}))
        with pytest.raises(TrainerRankError, match=r"trainer rank 1 died during update .*trainer\.resume=latest"):
            run(tmp_path / "run", *extra)
    assert fault.read_text() == "0"
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]
    rows = run(tmp_path / "run", *extra, "trainer.resume=latest")
    same_numbers(local_runs(FP32), rows)
