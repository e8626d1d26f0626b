"""FSDP2 at world size 1 on CUDA (NCCL, one process) in bf16 mixed precision: one LoRA update equals the
unsharded update of the same model and episodes within bf16 tolerance, and the fp32 masters move at lr 3e-7."""

import os
import socket

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def nccl():
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("qwen2-fsdp"), arch="qwen2", layers=2, hidden=128)


@pytest.mark.parametrize("lora", [True, False])
def test_fsdp_world_size_one_bf16_equals_the_unsharded_update(nccl, model_path, lora):
    from ctu.distributed.fsdp import gathered_named_tensors, make_reduce, shard_policy
    from tests.unit.test_fsdp import episodes, trainable_full, update

    overrides = [f"lora.enabled={str(lora).lower()}", "model.dtype=bfloat16", "trainer.kl_coef=0.0"]
    results = []
    for sharded in (False, True):
        from ctu.config import load_config
        from ctu.train.policy import build_policy

        cfg = load_config(None, [f"model.path={model_path}", "trainer.grad_clip=1000000.0",
                                 "trainer.entropy_coef=0.01", *overrides])
        torch.manual_seed(0)
        policy = build_policy(cfg, device="cuda")
        with torch.no_grad():
            g = torch.Generator().manual_seed(1)
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.copy_((torch.randn(p.shape, generator=g) * 0.05).to(p.device))
        if sharded:
            shard_policy(policy, compute_dtype=torch.bfloat16)
        before = trainable_full(policy)
        stats = update(policy, cfg, episodes(), 3e-7, reduce=make_reduce(device="cuda") if sharded else None)
        after = trainable_full(policy)
        merged = dict(gathered_named_tensors(policy) if sharded else policy.merged_named_tensors())
        results.append((stats, before, after, merged))
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
