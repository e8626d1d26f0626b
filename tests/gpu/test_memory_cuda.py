"""Memory on CUDA: FSDP2 with cpu_offload=true trains (inputs on the compute device, parameters offloaded to CPU);
release_memory gives the trainer's cached blocks back; the merged sync's peak is one module's merge."""

import pytest
import torch

from tests.gpu.test_fsdp_cuda import model_path, nccl  # noqa: F401 - fixtures

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _policy(path, *overrides):
    from ctu.config.schema import load_config
    from ctu.train.policy import build_policy

    cfg = load_config(None, [f"model.path={path}", "model.dtype=bfloat16", "trainer.kl_coef=0.0", *overrides])
    torch.manual_seed(0)
    return cfg, build_policy(cfg, device="cuda")


@pytest.mark.parametrize("lora", [True, False])
def test_cpu_offload_trains_on_cuda(nccl, model_path, lora):  # noqa: F811
    from ctu.distributed.fsdp import gathered_named_tensors, make_reduce, shard_policy
    from tests.unit.distributed.test_fsdp import episodes, update

    cfg, policy = _policy(model_path, f"lora.enabled={str(lora).lower()}")
    shard_policy(policy, compute_dtype=torch.bfloat16, cpu_offload=True)
    assert policy.device.type == "cuda"
    assert all(p.device.type == "cpu" for p in policy.trainable_parameters())  # offloaded shards
    stats = update(policy, cfg, episodes(), 1e-3, reduce=make_reduce(device="cuda"))
    assert stats["trained_tokens"] > 0 and stats["grad_norm"] == stats["grad_norm"]
    assert dict(gathered_named_tensors(policy))  # the sync gathers offloaded shards


def test_release_memory_empties_the_cache(model_path):  # noqa: F811
    from ctu.engines.cpu.host_memory import release_memory

    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del x
    reserved = torch.cuda.memory_reserved()
    release_memory()
    assert torch.cuda.memory_reserved() <= reserved - (256 << 20)


def test_the_merged_stream_peaks_at_one_module(model_path):  # noqa: F811
    _, policy = _policy(model_path)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn_like(p) * 1e-2)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for _name, tensor in policy.merged_named_tensors(torch.bfloat16):
        del tensor
    largest = max(p.numel() for n, p in policy.model.named_parameters() if n.endswith("base_layer.weight"))
    assert torch.cuda.max_memory_allocated() - base <= (4 + 4 + 2) * largest + (1 << 20)
