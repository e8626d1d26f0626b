"""FSDP2 at world size 1 on CUDA (NCCL, one process) in bf16 mixed precision: one LoRA update equals the
unsharded update of the same model and episodes within bf16 tolerance, and the fp32 masters move at lr 3e-7;
with a gradient clip that binds, FSDP's clip (a norm over the shards) scales the step as the unsharded one does
(with grad_clip=1e6 a wrong norm could not show)."""

import pytest
import torch

from tests.support.fsdp_helpers import perturb_lora_b, single_process_group

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def nccl():
    torch.cuda.set_device(0)
    with single_process_group("nccl", device_id=torch.device("cuda", 0)):
        yield


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.support.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("qwen2-fsdp"), arch="qwen2", layers=2, hidden=128)


def one_update(model_path, lora: bool, sharded: bool, lr: float, grad_clip: float, *extra: str):
    """(stats, trainable weights before, after, merged weights) of one policy update (SGD: tests/unit/distributed/test_fsdp.py)."""
    from ctu.config.schema import load_config
    from ctu.distributed.fsdp import gathered_named_tensors, make_reduce, shard_policy
    from ctu.train.policy import build_policy
    from tests.unit.distributed.test_fsdp import episodes, trainable_full, update

    cfg = load_config(None, [f"model.path={model_path}", f"trainer.grad_clip={grad_clip}", "trainer.entropy_coef=0.01",
                             f"lora.enabled={str(lora).lower()}", "model.dtype=bfloat16", "trainer.kl_coef=0.0", *extra])
    torch.manual_seed(0)
    policy = build_policy(cfg, device="cuda")
    perturb_lora_b(policy)
    if sharded:
        shard_policy(policy, compute_dtype=torch.bfloat16)
    before = trainable_full(policy)
    stats = update(policy, cfg, episodes(), lr, reduce=make_reduce(device="cuda") if sharded else None)
    after = trainable_full(policy)
    merged = dict(gathered_named_tensors(policy) if sharded else policy.merged_named_tensors())
    return stats, before, after, merged


def step_norm(before, after) -> float:
    return sum(float((after[n].float() - before[n].float()).norm()) ** 2 for n in after) ** 0.5


@pytest.mark.parametrize("lora", [True, False])
def test_a_binding_clip_scales_the_fsdp_step_as_the_unsharded_one(nccl, model_path, lora):
    """One SGD step clipped to a quarter of the gradient's norm: the step's norm is lr * grad_clip, sharded or
    not, and the two steps point the same way."""
    lr, one_step = 1e-2, ("trainer.mini_batches=1", "trainer.ppo_epochs=1")
    free = one_update(model_path, lora, False, lr, 1e6, *one_step)[0]["grad_norm"]
    clip = free / 4
    (plain, b0, a0, _), (fsdp, b1, a1, _) = (one_update(model_path, lora, sharded, lr, clip, *one_step)
                                             for sharded in (False, True))
    for stats, before, after in ((plain, b0, a0), (fsdp, b1, a1)):
        assert stats["grad_norm"] > 2 * clip  # the clip binds
        assert abs(step_norm(before, after) / (lr * clip) - 1) < 2e-2, (step_norm(before, after), lr * clip)
    assert abs(plain["grad_norm"] - fsdp["grad_norm"]) <= 2e-2 * plain["grad_norm"]
    for name in a0:
        d0, d1 = (a0[name] - b0[name]).flatten().float(), (a1[name] - b1[name]).flatten().float()
        if float(d0.norm()) > 0:
            assert float(d0 @ d1) / (float(d0.norm()) * float(d1.norm()) + 1e-30) > 0.98, name


@pytest.mark.parametrize("lora", [True, False])
def test_fsdp_world_size_one_bf16_equals_the_unsharded_update(nccl, model_path, lora):
    results = [one_update(model_path, lora, sharded, 3e-7, 1e6) for sharded in (False, True)]
    (plain, b0, a0, m0), (fsdp, b1, a1, m1) = results
    for key in ("loss", "pg_loss", "entropy", "grad_norm"):
        assert abs(plain[key] - fsdp[key]) <= 2e-2 * max(abs(plain[key]), 1e-3), (key, plain[key], fsdp[key])
    assert plain["trained_tokens"] == fsdp["trained_tokens"]
    assert {str(t.dtype) for t in a1.values()} == {"torch.float32"}
    moved = [n for n in a1 if not torch.equal(a1[n], b1[n])]
    assert moved, "fp32 masters did not move at lr 3e-7"
    for name in a0:  # the steps agree in direction and size (bf16 forwards, fp32 reduce)
        d0, d1 = (a0[name] - b0[name]).flatten().float(), (a1[name] - b1[name]).flatten().float()
        if float(d0.norm()) > 0:
            cos = float(d0 @ d1) / (float(d0.norm()) * float(d1.norm()) + 1e-30)
            assert cos > 0.98, (name, cos)
            assert abs(float(d1.norm()) / float(d0.norm()) - 1) < 5e-2, name
    assert m0.keys() == m1.keys()
    for name in m0:
        torch.testing.assert_close(m1[name].float().cpu(), m0[name].float().cpu(), rtol=1e-5, atol=1e-6)
