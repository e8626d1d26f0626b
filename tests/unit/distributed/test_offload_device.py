"""FSDP2 with ``distributed.cpu_offload=true``: the sharded parameters live on the CPU but forwards run on the mesh's
device, so inputs must go there. ``Policy.device`` (where every caller puts its inputs) is the compute device that
``shard_policy`` records, not the device of the first parameter (which was the CPU: a device mismatch at the first
forward on CUDA; tests/gpu/test_memory_cuda.py runs it there). CPU here: gloo, world size 1."""

import pytest
import torch


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.support.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("tiny-offload"), "qwen2", layers=2, hidden=64, intermediate=128)


def policy_for(path, *overrides):
    from ctu.config.schema import load_config
    from ctu.train.policy import build_policy

    config = load_config(None, [f"model.path={path}", "model.dtype=float32", "trainer.kl_coef=0.0", *overrides])
    torch.manual_seed(0)
    return config, build_policy(config, device="cpu")


def test_inputs_go_to_the_compute_device_not_where_the_parameters_are(model_path):
    _, policy = policy_for(model_path)
    assert policy.device == torch.device("cpu")  # no offload: the parameters' device
    policy.compute_device = torch.device("cuda", 0)  # what shard_policy records under cpu_offload on CUDA
    assert policy.device == torch.device("cuda", 0) and next(policy.model.parameters()).device.type == "cpu"


def test_shard_policy_records_the_compute_device_and_an_offloaded_update_runs(gloo, model_path, monkeypatch):
    from torch.distributed.fsdp import CPUOffloadPolicy

    from ctu.distributed import fsdp
    from tests.unit.distributed.test_fsdp import episodes, update

    # FSDP2 pins offloaded shards (needs an accelerator); unpinned, the same offload path runs on a CPU mesh
    monkeypatch.setattr(fsdp, "CPUOffloadPolicy", lambda: CPUOffloadPolicy(pin_memory=False))
    config, policy = policy_for(model_path, "lora.enabled=false")
    fsdp.shard_policy(policy, cpu_offload=True)
    assert policy.compute_device == torch.device("cpu")
    stats = update(policy, config, episodes(), 1e-3, reduce=fsdp.make_reduce())
    assert stats["trained_tokens"] > 0
    assert len(dict(fsdp.gathered_named_tensors(policy))) == len(list(policy.model.named_parameters()))
