"""The decode copy's sibling projections fused into one product each (``ctu/engines/hf/fused_linear.py``): the same
model, its parameters still written by name."""

from __future__ import annotations

import copy

import torch

from ctu.engines.hf.fused_linear import FusedMember, fuse_projections
from ctu.engines.hf.models import load_model


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_a_fused_model_computes_what_the_model_did_with_its_parameters_by_the_same_names():
    torch.manual_seed(0)
    model = load_model("tiny-random").eval()
    fused = copy.deepcopy(model)
    layers = model.config.num_hidden_layers
    assert fuse_projections(fused) == 2 * layers
    assert isinstance(fused.model.layers[0].self_attn.k_proj, FusedMember)
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in model.named_parameters()]
    ids = torch.randint(5, 1000, (3, 11))
    torch.testing.assert_close(logits(fused, ids), logits(model, ids), rtol=1e-5, atol=1e-5)
    params = dict(fused.named_parameters())
    with torch.no_grad():  # an update written by name, as the decode copy's refresh does
        for name, p in model.named_parameters():
            if name.endswith(("v_proj.weight", "up_proj.weight")):
                p.add_(0.05)
                params[name].copy_(p)
    torch.testing.assert_close(logits(fused, ids), logits(model, ids), rtol=1e-5, atol=1e-5)


def test_a_member_called_on_another_input_computes_its_own_product():
    torch.manual_seed(0)
    layer = load_model("tiny-random").model.layers[0].self_attn
    plain = copy.deepcopy(layer)
    fuse_projections(layer)
    x, y = torch.randn(2, 3, layer.q_proj.in_features), torch.randn(2, 3, layer.q_proj.in_features)
    with torch.no_grad():
        assert torch.allclose(layer.q_proj(x), plain.q_proj(x), atol=1e-6)
        assert torch.allclose(layer.k_proj(y), plain.k_proj(y), atol=1e-6)  # not q's product of x
        assert torch.allclose(layer.v_proj(x), plain.v_proj(x), atol=1e-6)  # x's, still kept
        assert torch.allclose(layer.k_proj(x), plain.k_proj(x), atol=1e-6)  # after the last member: computed anew
