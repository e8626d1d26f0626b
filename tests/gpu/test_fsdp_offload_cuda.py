"""FSDP2 with ``distributed.cpu_offload=true`` on CUDA (world size 1, the trainer ranks' own process group).

Offloaded shards live on the CPU while forwards run on the GPU. This covers what the CPU tier cannot reach:
- ``clip_grad_norm_`` all-reduces the CPU gradients' norms: the group needs a CPU backend beside NCCL
  (:func:`ctu.distributed.ray_trainer.process_group_backend`; an NCCL-only group fails, pytorch#148532);
- the reference's gathers (warm-start rebase, reference checkpoint, base-weight sync) move CPU shards to the
  mesh's device before ``full_tensor()``;
- ``trainer.autocast`` autocasts on CUDA, where the forwards run, not on the parameters' (CPU) device;
- no FSDP unit stays gathered after passes without backward, and no gradient after an update.
"""

import pytest
import torch
from torch.distributed.tensor import DTensor

from tests.support.fsdp_helpers import perturb_lora_b, single_process_group

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def offload_group():
    from ctu.distributed.ray_trainer import process_group_backend

    torch.cuda.set_device(0)
    with single_process_group(process_group_backend(cuda=True, cpu_offload=True)):
        yield


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.support.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("qwen2-offload"), arch="qwen2", layers=2, hidden=128)


def offloaded(model_path, *overrides):
    from ctu.config.schema import load_config
    from ctu.distributed.fsdp import shard_policy
    from ctu.train.policy import build_policy

    cfg = load_config(None, [f"model.path={model_path}", "trainer.grad_clip=1e-4", "trainer.kl_coef=0.1",
                             "trainer.micro_batch_tokens=40", *overrides])
    torch.manual_seed(0)
    policy = build_policy(cfg, device="cuda")
    perturb_lora_b(policy)
    shard_policy(policy, cpu_offload=True)
    assert next(policy.model.parameters()).device.type == "cpu" and policy.device.type == "cuda"
    return cfg, policy


def unsharded_params(model) -> list[str]:
    return [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]


@pytest.mark.parametrize("lora", [True, False])
def test_an_offloaded_update_clips_frees_its_gradients_and_reshards(offload_group, model_path, lora):
    from ctu.distributed.fsdp import make_reduce
    from ctu.train.update import sequence_kl
    from tests.unit.distributed.test_fsdp import episodes, trainable_full, update

    cfg, policy = offloaded(model_path, f"lora.enabled={str(lora).lower()}", "model.dtype=bfloat16",
                            "trainer.ppo_epochs=2")
    before = trainable_full(policy)
    stats = update(policy, cfg, episodes(), 1e-2, reduce=make_reduce(device="cuda"))
    assert stats["updates"] == 2 and stats["grad_norm"] > 1e-4  # the clip binds: the CPU all-reduce ran
    after = trainable_full(policy)
    assert any(not torch.equal(after[n], before[n]) for n in after)
    assert [n for n, p in policy.model.named_parameters() if p.grad is not None] == []
    assert sequence_kl(policy, episodes(), cfg.trainer, 0.9, reduce=make_reduce(device="cuda"))
    assert unsharded_params(policy.model) == []
    if policy.reference is not None:
        assert unsharded_params(policy.reference) == []


def test_offloaded_lora_rebase_checkpoint_and_base_sync_gather_on_the_gpu(offload_group, model_path):
    from ctu.distributed.fsdp import gathered_lora_tensors, gathered_named_tensors
    from ctu.distributed.reference import (
        gathered_base_tensors,
        gathered_reference_state,
        load_sharded_reference,
        rebase_sharded_reference,
    )

    _, policy = offloaded(model_path, "lora.enabled=true", "model.dtype=bfloat16")
    merged = {n: t.float().cpu() for n, t in gathered_named_tensors(policy, dtype=torch.float32)}
    rebased = rebase_sharded_reference(policy)
    assert rebased and all(t.device.type == "cpu" for t in rebased.values())
    assert all(float(t.abs().sum()) == 0 for n, t in gathered_lora_tensors(policy).items() if "lora_B" in n)
    base = gathered_base_tensors(policy)
    for name, tensor in merged.items():  # the warm start is now in the base, within one bf16 rounding
        torch.testing.assert_close(base[name].float(), tensor, rtol=1e-2, atol=1e-2)
    state = gathered_reference_state(policy, rebased)
    assert state.keys() == rebased.keys()
    load_sharded_reference(policy, state)


def test_offloaded_full_fine_tuning_reference_state_gathers(offload_group, model_path):
    from ctu.distributed.reference import gathered_reference_state, rebase_sharded_reference

    _, policy = offloaded(model_path, "lora.enabled=false", "model.dtype=bfloat16")
    assert rebase_sharded_reference(policy) == {}
    state = gathered_reference_state(policy, {})
    assert state and all(t.device.type == "cpu" for t in state.values())


def test_trainer_autocast_runs_bf16_on_the_gpu_over_offloaded_fp32_masters(offload_group, model_path):
    from ctu.train.logprobs import body_and_head, token_logprobs

    _, policy = offloaded(model_path, "lora.enabled=false", "model.dtype=float32", "trainer.autocast=bfloat16")
    _, head = body_and_head(policy.model)
    seen = set()
    handle = head.register_forward_hook(lambda module, args, out: seen.add((out.dtype, out.device.type)))
    ids = torch.tensor([[1, 5, 9, 7, 3, 11]], device="cuda")
    try:
        with torch.no_grad():
            token_logprobs(policy.model, ids, torch.ones_like(ids), train=True)
    finally:
        handle.remove()
    assert seen == {(torch.bfloat16, "cuda")}, seen
