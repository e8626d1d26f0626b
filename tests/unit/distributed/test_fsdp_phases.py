"""What an FSDP2-sharded trainer leaves behind between phases (CPU, gloo, world size 1, in process).

- No FSDP unit stays gathered after a pass without backward: FSDP2's root does not reshard after forward, and
  ctu never runs the root's forward (it unshards it from hooks on the body and the head), so only a backward
  reshards it; the frozen reference (full fine-tuning) never has one, and the policy's root stayed gathered
  from the parity probe through every rollout.
- No gradients survive an update: they were freed only by the next step's ``zero_grad``, through the rollouts.
- ``distributed.cpu_offload`` needs a process group with a CPU backend (``clip_grad_norm_`` all-reduces the
  offloaded gradients' norms on the CPU; NCCL has none, pytorch#148532), and the trainer's autocast follows
  where forwards run, not where offloaded parameters are stored.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.support.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("tiny-phases"), "llama", layers=2, hidden=64, intermediate=128)


def sharded(model_path, *overrides):
    from ctu.distributed.fsdp import shard_policy
    from tests.unit.distributed.test_fsdp import make_policy

    cfg, policy = make_policy(model_path, list(overrides))
    return cfg, shard_policy(policy)


def gathered_units(model) -> list[str]:
    """Names of parameters registered unsharded (a plain tensor, not the DTensor shard): a gathered unit."""
    return [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]


def test_scoring_without_backward_leaves_every_unit_resharded(gloo, model_path):
    """KL in the reward and the update's scoring (policy and full-fine-tuning reference), then the parity
    probe's trainer side: afterwards every parameter of both models is a shard again, the root's included."""
    from ctu.distributed.fsdp import make_reduce
    from ctu.distributed.ray_trainer import TrainerRank
    from ctu.train.update import sequence_kl
    from tests.unit.distributed.test_fsdp import episodes, update

    cfg, policy = sharded(model_path, "lora.enabled=false", "trainer.ppo_epochs=2")
    assert not gathered_units(policy.model) and not gathered_units(policy.reference)
    kls = sequence_kl(policy, episodes(), cfg.trainer, 0.9, reduce=make_reduce())
    assert any(k != 0 for k in kls)
    assert gathered_units(policy.model) == [] and gathered_units(policy.reference) == []
    stats = update(policy, cfg, episodes(), 1e-3, reduce=make_reduce())  # scores old and reference logprobs
    assert stats["updates"] == 2 and stats["kl"] > 0
    assert gathered_units(policy.reference) == [] and gathered_units(policy.model) == []
    rank = TrainerRank(cfg, 0, 1)
    rank.policy = policy
    ids = torch.tensor([[1, 5, 9, 7, 3]])
    assert rank.score(ids, torch.ones_like(ids), 0.9).shape == (1, 4)
    assert gathered_units(policy.model) == []


@pytest.mark.parametrize("lora", [True, False])
def test_no_gradient_survives_a_sharded_update(gloo, model_path, lora):
    from ctu.distributed.fsdp import make_reduce
    from ctu.train.update import sft_update
    from tests.unit.distributed.test_fsdp import episodes, update

    cfg, policy = sharded(model_path, f"lora.enabled={str(lora).lower()}")
    stats = update(policy, cfg, episodes(), 1e-3, reduce=make_reduce())
    assert stats["grad_norm"] > 0
    assert [n for n, p in policy.model.named_parameters() if p.grad is not None] == []
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=1e-3)
    assert sft_update(policy, opt, episodes()[:3], 64, reduce=make_reduce()) > 0
    assert [n for n, p in policy.model.named_parameters() if p.grad is not None] == []


def test_no_gradient_survives_an_update_in_one_process(model_path):
    from tests.unit.distributed.test_fsdp import episodes, make_policy, update

    cfg, policy = make_policy(model_path, ["lora.enabled=true"])
    assert update(policy, cfg, episodes(), 1e-3)["grad_norm"] > 0
    assert [n for n, p in policy.model.named_parameters() if p.grad is not None] == []


def test_offloaded_ranks_get_a_cpu_backend_beside_nccl(monkeypatch):
    """The backend ``TrainerRank.setup`` asks for on a CUDA machine (the process group is the outside world here:
    recorded, and setup stops there)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    from ctu.config.schema import load_config
    from ctu.distributed.ray_trainer import TrainerRank

    class Stop(Exception):
        pass

    asked = []

    def init(backend, **_):
        asked.append(backend)
        raise Stop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "init_process_group", init)
    monkeypatch.setattr("ctu.distributed.ray_trainer.rendezvous_store", lambda *args: None)  # no peer would come
    for offload in (True, False):
        config = load_config(None, ["model.path=tiny-random", f"distributed.cpu_offload={str(offload).lower()}"])
        with pytest.raises(Stop):
            TrainerRank(config, 0, 2).setup("tcp://127.0.0.1:1")
    offloaded, plain = (BackendConfig(Backend(b)).get_device_backend_map() for b in asked)
    assert offloaded == {"cuda": "nccl", "cpu": "gloo"}
    assert plain["cuda"] == "nccl"


def test_an_offloaded_update_clips_over_the_cpu_backend(gloo, model_path, monkeypatch):
    """Offloaded shards on a CPU mesh: the update (clip_grad_norm_ binding) runs its CPU all-reduces."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    from ctu.distributed import fsdp
    from tests.unit.distributed.test_fsdp import episodes, make_policy, update

    monkeypatch.setattr(fsdp, "CPUOffloadPolicy", lambda: CPUOffloadPolicy(pin_memory=False))  # pinning needs CUDA
    cfg, policy = make_policy(model_path, ["lora.enabled=true", "trainer.grad_clip=1e-3"])
    fsdp.shard_policy(policy, cpu_offload=True)
    stats = update(policy, cfg, episodes(), 1e-3, reduce=fsdp.make_reduce())
    assert stats["grad_norm"] > 1e-3  # the clip binds


def test_the_trainer_autocasts_where_forwards_run_not_where_parameters_are_stored(model_path):
    """Under ``cpu_offload`` on CUDA the fp32 masters live on the CPU while FSDP computes on the GPU: autocast
    must be CUDA's (a CPU autocast region leaves CUDA matmuls in fp32, i.e. ``trainer.autocast`` silently off)."""
    import warnings

    from ctu.engines.cpu.precision import COMPUTE_DEVICE_ATTR, TRAIN_DTYPE_ATTR, compute_context
    from tests.unit.distributed.test_fsdp import make_policy

    _, policy = make_policy(model_path, ["lora.enabled=true"])
    model = policy.model
    setattr(model, TRAIN_DTYPE_ATTR, torch.bfloat16)
    assert compute_context(model, train=True).device == "cpu"  # one process: the parameters' device
    setattr(model, COMPUTE_DEVICE_ATTR, "cuda")  # what shard_policy records for a CUDA mesh
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no CUDA in this process: torch warns and disables the region
        context = compute_context(model, train=True)
    assert context.device == "cuda" and next(model.parameters()).device.type == "cpu"


def test_shard_policy_records_the_mesh_device_for_autocast(gloo, model_path):
    from ctu.engines.cpu.precision import COMPUTE_DEVICE_ATTR

    _, policy = sharded(model_path, "lora.enabled=false")
    assert getattr(policy.model, COMPUTE_DEVICE_ATTR) == "cpu"
    assert getattr(policy.reference, COMPUTE_DEVICE_ATTR) == "cpu"
