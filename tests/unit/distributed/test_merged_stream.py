"""The merged weight sync is a stream: one tensor at a time, each LoRA delta merged per module in fp32 and cast
once to the compute dtype, so the sync's extra memory is one layer's merge, not every delta of the model at once
(what made the first sync of the LoRA presets run out of memory beside an awake vLLM)."""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ctu.config.schema import load_config


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from tests.support.models import save_random_model

    return save_random_model(tmp_path_factory.mktemp("tiny-qwen2-4"), "qwen2", layers=4, hidden=64, intermediate=128)


def lora_policy(path):
    from ctu.train.policy import build_policy

    config = load_config(None, [f"model.path={path}", "model.dtype=bfloat16"])
    torch.manual_seed(1)
    policy = build_policy(config, device="cpu")
    with torch.no_grad():  # a trained adapter: lora_B != 0
        for n, p in policy.model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 1e-2)
    return config, policy


class Allocations(TorchDispatchMode):
    """Every tensor an aten op creates, weakly referenced: which of them are still alive, and their bytes."""

    def __init__(self):
        super().__init__()
        self.made: list[weakref.ref] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.made.append(weakref.ref(t))
        return out

    def live_bytes(self, exclude: set[int]) -> int:
        storages = {}
        for ref in self.made:
            t = ref()
            if t is not None and t.untyped_storage().data_ptr() not in exclude:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(storages.values())


def peak_extra_bytes(stream, model) -> tuple[int, int]:
    """(the most bytes the stream holds besides the model's own weights and the tensor it just gave, the number of
    tensors), the consumer dropping each tensor before asking for the next."""
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    peak = count = 0
    mode = Allocations()
    with mode:
        iterator = iter(stream)
        while True:
            try:
                _, tensor = next(iterator)
            except StopIteration:
                break
            count += 1
            peak = max(peak, mode.live_bytes(own | {tensor.untyped_storage().data_ptr()}))
            del tensor
    return peak, count


def test_the_merged_stream_holds_about_one_layer_at_a_time(model_path):
    from ctu.distributed.group import LocalTrainer

    config, policy = lora_policy(model_path)
    group = LocalTrainer.__new__(LocalTrainer)  # the group around this policy (no optimizer needed)
    group.config, group.policy, group.model = config, policy, policy.model
    largest = max(p.numel() for n, p in policy.model.named_parameters() if n.endswith("base_layer.weight"))
    all_deltas = sum(p.numel() for n, p in policy.model.named_parameters() if n.endswith("base_layer.weight")) * 4
    peak, count = peak_extra_bytes(group.merged_weights(), policy.model)
    assert count == len([n for n, _ in policy.model.named_parameters() if ".lora_" not in n])
    # one module's merge in flight (fp32 base + fp32 delta): every delta at once was ~all_deltas
    assert peak <= 3 * 4 * largest < all_deltas / 4, (peak, largest, all_deltas)


def test_the_stream_sends_the_fp32_merge_cast_once_to_the_compute_dtype(model_path):
    from ctu.distributed.group import LocalTrainer

    config, policy = lora_policy(model_path)
    group = LocalTrainer.__new__(LocalTrainer)
    group.config, group.policy, group.model = config, policy, policy.model
    expected = {}
    with torch.no_grad():
        for name, module in policy.model.named_modules():
            if hasattr(module, "lora_A") and hasattr(module, "base_layer"):
                a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
                merged = module.base_layer.weight.float() + (b @ a) * module.scaling["default"]
                expected[name.replace("base_model.model.", "") + ".weight"] = merged.to(torch.bfloat16)
    sent = dict(group.merged_weights())
    assert expected and all(t.dtype == torch.bfloat16 for t in sent.values())
    for name, want in expected.items():
        scale = float(want.float().abs().max())
        torch.testing.assert_close(sent[name].float(), want.float(), rtol=2 ** -7, atol=2 ** -7 * scale)
    base = {n.replace("base_model.model.", "").replace(".base_layer", ""): p for n, p in
            policy.model.named_parameters() if ".lora_" not in n}
    assert set(sent) == set(base)
    changed = [n for n in expected if not torch.equal(sent[n], base[n].detach())]
    assert len(changed) == len(expected)  # every delta survived the single cast
