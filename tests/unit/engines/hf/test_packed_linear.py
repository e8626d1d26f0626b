"""The decode copy's products by weights laid out once for oneDNN (``ctu/engines/hf/packed_linear.py``): the same
outputs as ``F.linear``, the plain weights freed (but a tied embedding's), and every update laid out again. The
helpers run in fp32 on any CPU; the bf16 copy packs only where the CPU computes bf16 natively."""

from __future__ import annotations

import pytest
import torch

from ctu.engines.hf import packed_linear
from ctu.engines.hf.decode_copy import DecodeCopy
from ctu.engines.hf.fused_linear import FusedMember, fuse_projections
from ctu.engines.hf.models import load_model
from ctu.engines.hf.packed_linear import PackedLinear, pack, unpack

from .test_decode_copy import lora_model, merged_bf16

IDS = torch.tensor([[1, 520, 33, 88, 2, 198], [1, 77, 4000, 12, 13, 14]])


def native_bf16_packing() -> bool:
    import os

    saved = os.environ.pop("CTU_NATIVE_BF16", None)  # the default run pins it to 0: ask the CPU itself
    try:
        return packed_linear.available(torch.bfloat16)
    finally:
        if saved is not None:
            os.environ["CTU_NATIVE_BF16"] = saved


def fused_model():
    torch.manual_seed(0)
    model = load_model("tiny-random").eval().requires_grad_(False)
    for p in model.parameters():  # weights of their own, as the decode copy's (not the checkpoint's memory map)
        p.data = p.data.clone()
    fuse_projections(model)
    return model


def test_packed_products_are_the_plain_products_and_free_all_but_the_tied_weight():
    model = fused_model()
    with torch.no_grad():
        before = model(input_ids=IDS).logits
        freed = pack(model)
        after = model(input_ids=IDS).logits
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    products = [m for m in model.modules() if isinstance(m, (PackedLinear, FusedMember))]
    assert products and all((m.shared.packed if isinstance(m, FusedMember) else m.packed) is not None for m in products)
    embedding = model.get_input_embeddings().weight
    assert model.lm_head.weight is embedding and embedding.untyped_storage().nbytes() > 0  # tied: kept, and read
    plain = [m.weight for m in products if m is not model.lm_head]
    assert all(w.untyped_storage().nbytes() == 0 for w in plain)  # fails on a pack that keeps both copies
    assert len(freed) == len({w.untyped_storage()._cdata for w in plain})


def test_a_copy_of_a_model_the_trainer_patched_computes_by_its_packed_weights():
    """The decode copy is made from the policy after a training step, whose frozen Linears the trainer's cast_once
    gave a forward of their own: fails (reading a freed weight) on packing that leaves that forward in place."""
    import copy

    from ctu.engines.cpu.precision import TRAIN_DTYPE_ATTR
    from ctu.train.cast_once import cast_once

    policy = load_model("tiny-random").eval().requires_grad_(False)
    setattr(policy, TRAIN_DTYPE_ATTR, torch.bfloat16)
    with cast_once(policy):
        pass
    assert "forward" in vars(policy.model.layers[0].self_attn.o_proj)  # patched
    made = copy.deepcopy(policy)
    for p in made.parameters():
        p.data = p.data.clone()
    fuse_projections(made)
    with torch.no_grad():
        before = made(input_ids=IDS).logits
        pack(made)
        torch.testing.assert_close(made(input_ids=IDS).logits, before, rtol=1e-5, atol=1e-5)


def test_an_update_is_written_into_the_plain_weights_and_laid_out_again():
    model, reference = fused_model(), fused_model()
    freed = pack(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.mul_(1.5)
        unpack(model, freed)  # the plain weights' storage back: written as decode_copy.refresh writes them
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            p.copy_(q)
        pack(model)
        torch.testing.assert_close(model(input_ids=IDS).logits, reference(input_ids=IDS).logits,
                                   rtol=1e-5, atol=1e-5)  # fails on packed weights not laid out again


@pytest.mark.skipif(not native_bf16_packing(), reason="oneDNN packs bf16 weights only on AVX-512 CPUs")
def test_the_bf16_copy_decodes_bit_for_bit_as_f_linear_through_updates_and_releases(monkeypatch):
    """The copy of a LoRA model, packed, computes exactly what a bf16 model of the merged weights computes by
    ``F.linear``; again after an update and after a release."""
    monkeypatch.delenv("CTU_NATIVE_BF16", raising=False)
    model = lora_model()
    copies = DecodeCopy(torch.bfloat16)
    assert copies.packs
    made = copies.get(model, version=1)

    def logits(m):
        with torch.no_grad():
            return m(input_ids=IDS).logits

    assert isinstance(made.lm_head, PackedLinear) and made.lm_head.packed is not None
    assert torch.equal(logits(made), logits(merged_bf16(model)))
    for round_ in (2, 3):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.02)
        copies.release()
        assert made.lm_head.packed is None and copies.released
        assert copies.get(model, version=round_) is made and copies.builds == 1
        assert torch.equal(logits(made), logits(merged_bf16(model)))
