"""The merged export streams the merged weights into the model it writes: one merged tensor at a time, not a dict
of all of them beside a freshly loaded model (SmolLM2-135M: 540 MB more at the end of every run, the run's RSS
peak), and what it writes is the merged policy."""

import gc
import weakref

import torch

from ctu.config.schema import load_config


def test_export_holds_one_merged_tensor_at_a_time_and_writes_the_merged_policy(tmp_path):
    from transformers import AutoModelForCausalLM

    from ctu.train.policy import build_policy
    from ctu.train.weights import export
    from tests.support.models import save_random_model

    path = save_random_model(tmp_path / "tiny", "llama", layers=2, hidden=64, intermediate=128)
    config = load_config(None, [f"model.path={path}", "model.dtype=float32", "lora.enabled=true"])
    torch.manual_seed(0)
    policy = build_policy(config, device="cpu")
    with torch.no_grad():  # a nonzero adapter, so that merging matters
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    expected = {n: t.clone() for n, t in policy.merged_named_tensors(dtype=torch.float32)}
    original = policy.merged_named_tensors
    own = {p.untyped_storage().data_ptr() for p in policy.model.parameters()}
    alive, most = [], [0]

    def tracked(dtype=None):
        for name, tensor in original(dtype=dtype):
            gc.collect()
            most[0] = max(most[0], sum(r() is not None for r in alive))
            if tensor.untyped_storage().data_ptr() not in own:  # a new (merged or cast) tensor, not a parameter
                alive.append(weakref.ref(tensor))
            yield name, tensor

    policy.merged_named_tensors = tracked
    paths = export(policy, tmp_path / "export", path)
    assert len(alive) > 4
    assert most[0] <= 1, f"{most[0]} merged tensors held at once"
    written = AutoModelForCausalLM.from_pretrained(paths["merged"], dtype=torch.float32).state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(written[name], tensor, rtol=0, atol=0)
