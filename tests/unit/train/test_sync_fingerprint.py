"""The fingerprint check on the FSDP2 -> Ray rollout workers path: trainer rank 0 packs the merged weights into
Ray's object store (a ``PackedRef`` the driver never fetches) and fingerprints the packed values as it packs, so an
engine that acknowledged the load but holds other weights fails the sync there too (it passed unchecked)."""

import pytest
import torch

from ctu.config.schema import load_config
from ctu.distributed.transfer import PackedRef, pack, unpack
from ctu.engines.checks.fingerprint import Accumulator, matches, of_module
from ctu.engines.checks.parity import ParityError
from ctu.train.sync import WeightSync


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [("a.weight", torch.randn(6, 4, generator=g)), ("b.weight", torch.randn(3, 4, generator=g))]


class LocalRef(PackedRef):
    """A PackedRef whose packed weights are here, not in Ray's object store."""

    def __init__(self, packed, sums):
        super().__init__(None, sums)
        self.packed = packed

    def __iter__(self):
        return unpack(self.packed)


class Holder(torch.nn.Module):
    def __init__(self, named):
        super().__init__()
        self.held = torch.nn.ParameterList([torch.nn.Parameter(t.clone()) for _, t in named])


class RankZeroGroup:
    """Trainer rank 0's side of a merged sync over Ray: the weights packed (and fingerprinted) in the wire dtype."""

    def __init__(self, dtype=torch.bfloat16):
        self.dtype, self.seed = dtype, 0

    def release_memory(self):
        pass

    def merged_weights(self):
        sums = Accumulator([str(self.dtype).removeprefix("torch.")])
        packed = pack(weights(self.seed), self.dtype, sums=sums)
        return LocalRef(packed, sums.sums)

    def score(self, ids, attn, temperature):
        return torch.zeros(ids.shape[1] - 1)


class Workers:
    """Rollout workers that load what they are sent, or (``stale``) acknowledge it and keep what they held."""

    def __init__(self, stale=False):
        self.stale, self.model, self.version = stale, None, 0

    def sleep(self):
        pass

    def wake_up(self):
        pass

    def update_weights(self, named, version):
        if not self.stale or self.model is None:
            self.model = Holder(list(named))
        self.version = version

    def parity(self, score_fn, **_):
        return [0.0]

    def versions(self):
        return [self.version]

    def fingerprints(self):
        return [of_module(self.model)]


def test_the_packed_values_fingerprint_as_the_engine_holds_them():
    sums = Accumulator(["bfloat16"])
    packed = pack(weights(), torch.bfloat16, sums=sums)
    assert matches(of_module(Holder(list(unpack(packed)))), sums.fingerprint("bfloat16"))


@pytest.mark.parametrize("stale", [False, True])
def test_workers_that_keep_old_weights_under_a_packed_ref_fail_the_sync(stale):
    config = load_config(None, ["model.path=tiny-random", "engine.weight_sync=merged", "engine.parity_tolerance=1.0"])
    group, pool = RankZeroGroup(), Workers(stale)
    sync = WeightSync(config, group, pool)
    sync.after_update(0)
    group.seed = 1  # the update moved the weights
    if not stale:
        sync.after_update(1)
        return
    with pytest.raises(ParityError, match="engine 0 acknowledged the weights of version 1 but holds other ones"):
        sync.after_update(1)
