"""Full tensors of a sharded policy are materialized where they are kept: rank 0 (2 gloo ranks on CPU).

The reference checkpoint's weights (``gathered_reference_state``) and the base-weight sync
(``gathered_base_tensors``) are collectives every rank joins, but only rank 0 returns them: the other ranks used to
build the same full host copies and drop them at the end (a whole model per rank at once). The Ray export streams
the merged fp32 weights into the model it writes (one tensor at a time) instead of a dict of all of them beside it.
Spies record how many gathered tensors are alive at once on each rank (weak references); nothing is mocked.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.support.fsdp_helpers import free_port, spawned_rank
from tests.support.models import save_random_model
from tests.unit.distributed.test_fsdp import make_policy


def spy_full(module) -> dict:
    """Wrap ``module._full``: the largest number of earlier gathered tensors still alive at any later gather."""
    original, alive, seen = module._full, [], {"most": 0, "calls": 0}

    def tracked(t):
        gc.collect()
        seen["most"] = max(seen["most"], sum(r() is not None for r in alive))
        out = original(t)
        seen["calls"] += 1
        alive.append(weakref.ref(out))
        return out

    module._full = tracked
    return seen


def spy_stream(module, name: str) -> dict:
    """Wrap the generator ``module.name``: the most earlier-yielded tensors alive when the next one comes."""
    original, alive, seen = getattr(module, name), [], {"most": 0, "yielded": 0}

    def tracked(*args, **kwargs):
        for key, tensor in original(*args, **kwargs):
            gc.collect()
            seen["most"] = max(seen["most"], sum(r() is not None for r in alive))
            alive.append(weakref.ref(tensor))
            seen["yielded"] += 1
            yield key, tensor

    setattr(module, name, tracked)
    return seen


def job(rank: int, model_path: str, out: str) -> dict:
    from ctu.distributed import fsdp, reference
    from ctu.distributed.ray_trainer import TrainerRank
    from ctu.engines.hf.models import load_tokenizer

    got: dict = {}
    _, full = make_policy(model_path, ["lora.enabled=false"])
    fsdp.shard_policy(full)
    original = reference._full
    seen = spy_full(reference)
    state = reference.gathered_reference_state(full, {})
    got["reference"] = {"none": state is None, "keys": sorted(state or {}), **seen}
    reference._full = original

    cfg, lora = make_policy(model_path, ["lora.enabled=true"])
    fsdp.shard_policy(lora)
    seen = spy_full(reference)
    base = reference.gathered_base_tensors(lora)
    got["base"] = {"none": base is None, "keys": sorted(base or {}), **seen}

    expected = {n: t.clone() for n, t in fsdp.gathered_named_tensors(lora, dtype=torch.float32)}
    trainer = TrainerRank(cfg, rank, 2)
    trainer.policy, trainer.tokenizer = lora, load_tokenizer(model_path)
    seen = spy_stream(fsdp, "gathered_named_tensors")
    paths = trainer.export(str(Path(out) / "export"), model_path)
    got["export"] = {"paths": paths, "expected": expected, **seen}
    return got


def _run(rank: int, init: str, model_path: str, out: str):
    import torch.distributed as dist

    with spawned_rank(rank, out):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
        torch.save(job(rank, model_path, out), Path(out) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rank0")
    model_path = save_random_model(tmp / "tiny-llama", arch="llama", layers=2, hidden=64)
    try:
        mp.start_processes(_run, args=(f"tcp://127.0.0.1:{free_port()}", str(model_path), str(tmp)), nprocs=2,
                           start_method="spawn")
    except Exception as e:
        errors = "\n".join(p.read_text() for p in sorted(tmp.glob("error-*.txt")))
        raise AssertionError(f"distributed job failed:\n{errors}") from e
    return [torch.load(tmp / f"rank{k}.pt", weights_only=False) for k in range(2)]


@pytest.mark.parametrize("what", ["reference", "base"])
def test_only_rank_0_keeps_gathered_weights(ranks, what):
    zero, one = ranks[0][what], ranks[1][what]
    assert not zero["none"] and len(zero["keys"]) == zero["calls"] > 4
    assert one["none"] and one["calls"] == zero["calls"]  # rank 1 joins every gather
    assert one["most"] == 0, f"rank 1 held {one['most']} full tensors at once"


def test_the_ray_export_streams_the_merged_weights_into_the_model_it_writes(ranks):
    from transformers import AutoModelForCausalLM

    zero, one = ranks[0]["export"], ranks[1]["export"]
    assert one["paths"] is None and one["yielded"] == 0
    expected = zero["expected"]
    assert zero["yielded"] == len(expected) > 4
    assert zero["most"] <= 1, f"rank 0 held {zero['most']} merged tensors at once"
    written = AutoModelForCausalLM.from_pretrained(zero["paths"]["merged"], dtype=torch.float32).state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(written[name], tensor, rtol=0, atol=0)
    assert Path(zero["paths"]["adapter"], "adapter_model.safetensors").is_file()
