"""Ray weight sync in the compute dtype, with one host copy before the object store and none after it.

Counted on CPU with a tiny model and a local Ray cluster: bytes that torch copies (a dispatch mode over every
aten copy), bytes pickled in band (pickle 5 sends numpy buffers out of band: Ray writes those into the store
without another copy), bytes ``ray.put`` stores, and whether ``ray.get`` hands back store memory (read-only,
zero-copy) or copies. Before: fp32 torch tensors pickled (in band) at every hop, re-put by the driver."""

import os
import pickle

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ctu.config.schema import load_config

COPIES = {torch.ops.aten.copy_, torch.ops.aten._to_copy, torch.ops.aten.clone, torch.ops.aten.contiguous}


class CopiedBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in COPIES and isinstance(out, torch.Tensor):
            self.bytes += out.numel() * out.element_size()
        return out


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


def fp32_masters():
    torch.manual_seed(0)
    return {f"model.layers.{i}.w": torch.randn(64, 96) for i in range(4)} | {"model.embed_tokens.weight":
                                                                            torch.randn(500, 64)}


def in_band_bytes(obj) -> tuple[int, int]:
    """(bytes pickled in band, bytes sent out of band) under pickle 5, as Ray serializes."""
    buffers = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return len(data), sum(memoryview(b).nbytes for b in buffers)


def test_pack_copies_once_into_the_compute_dtype_and_pickles_out_of_band():
    from ctu.distributed.transfer import pack, unpack

    weights = fp32_masters()
    bf16 = sum(t.numel() * 2 for t in weights.values())
    with CopiedBytes() as copied:
        packed = pack(weights.items(), torch.bfloat16)
    assert packed.nbytes == bf16 and copied.bytes == bf16  # one copy, already half of fp32
    in_band, out_of_band = in_band_bytes(packed)
    assert out_of_band == bf16 and in_band < 4096
    with CopiedBytes() as copied:
        back = dict(unpack(packed))
    assert copied.bytes == 0
    for name, tensor in weights.items():
        assert back[name].dtype == torch.bfloat16 and torch.equal(back[name], tensor.to(torch.bfloat16))


def test_the_object_store_hands_the_packed_weights_back_without_a_copy(ray):
    from ctu.distributed.transfer import pack, unpack

    packed = pack(fp32_masters().items(), torch.bfloat16)
    got = ray.get(ray.put(packed))
    assert all(not a.flags.writeable for a in got.arrays)  # store memory, mapped read-only: no copy
    with CopiedBytes() as copied:
        tensors = list(unpack(got))
    assert copied.bytes == 0
    assert [t.data_ptr() for _, t in tensors] == [a.ctypes.data for a in got.arrays]


def pool_without_workers(config):
    from ctu.distributed.ray_pool import RayPool

    pool = RayPool.__new__(RayPool)
    pool.config, pool.workers, pool.dead, pool.latest, pool.started = config, [], set(), (None, -1), False
    return pool


def test_the_pool_puts_the_compute_dtype_once_and_passes_a_trainer_ref_on(ray, monkeypatch):
    from ctu.distributed.transfer import PackedRef, pack

    config = load_config(None, ["model.path=tiny-random", "model.dtype=bfloat16"])
    pool = pool_without_workers(config)
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda obj, **k: (puts.append(obj), real_put(obj, **k))[1])
    weights = fp32_masters()
    pool.update_weights(weights.items(), version=1)  # an in-process trainer's stream
    assert len(puts) == 1
    in_band, out_of_band = in_band_bytes(puts[0])
    assert out_of_band == sum(t.numel() * 2 for t in weights.values()) and in_band < 4096
    ref = real_put(pack(weights.items(), torch.bfloat16))  # what trainer rank 0 puts
    pool.update_weights(PackedRef(ref), version=2)
    assert len(puts) == 1 and pool.weights_ref == ref  # passed on, not fetched and re-put


def test_a_worker_loads_packed_weights(ray, tmp_path):
    from ctu.distributed.ray_pool import RolloutWorker
    from ctu.distributed.transfer import pack

    config = load_config("configs/quickstart.yaml", ["model.path=tiny-random", f"run.dir={tmp_path}"])
    worker = RolloutWorker(config)
    params = dict(worker.engine.model.named_parameters())
    torch.manual_seed(3)
    new = {n: torch.randn_like(p) for n, p in params.items()}
    got = ray.get(ray.put(pack(new.items(), torch.float32)))
    assert worker.load_weights(got, 5) == 5
    for name, p in params.items():
        assert torch.equal(p.detach(), new[name].to(p.dtype)), name
