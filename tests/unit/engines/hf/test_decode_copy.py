"""``engine.decode_dtype``: the hf engine decodes with a bf16 copy of fp32 (LoRA) weights where the CPU computes bf16
natively, merged again after every weight change, and samples what a bf16 model of the merged weights samples."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model

from ctu.config.fields import EngineConfig
from ctu.engines.base import SamplingParams
from ctu.engines.hf.decode_copy import DecodeCopy, prepare, resolve_decode_dtype
from ctu.engines.hf.engine import HFEngine
from ctu.engines.hf.hf_api import quiet_peft_wrap
from ctu.engines.hf.models import load_model, load_tokenizer

PROMPTS = [[1, 520, 33, 88, 2, 198, 1, 520], [1, 77, 4000], [1, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]


def lora_model(seed: int = 0):
    torch.manual_seed(seed)
    with quiet_peft_wrap():
        model = get_peft_model(load_model("tiny-random"), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():  # a trained adapter: B is not zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model.eval()


def merged_bf16(model):
    """The merged model as a bf16 checkpoint of it loads (bf16 parameters, fp32 rotary frequencies), prepared for
    decoding as the engine's copy is (fused projections, grouped one-token attention)."""
    merged = copy.deepcopy(model).merge_and_unload()
    prepare(merged, torch.bfloat16)
    assert all(b.dtype == torch.float32 for b in merged.buffers() if b.is_floating_point())
    return merged


def test_the_setting_picks_bf16_only_where_the_cpu_computes_it_natively(monkeypatch):
    monkeypatch.setenv("CTU_NATIVE_BF16", "1")
    assert resolve_decode_dtype("auto", "cpu")[0] is torch.bfloat16
    assert resolve_decode_dtype("float32", "cpu")[0] is None
    assert resolve_decode_dtype("auto", "cuda")[0] is None  # CUDA decodes in the weights' compute dtype already
    monkeypatch.delenv("CTU_NATIVE_BF16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # the forced AVX2 kind: fp32
    dtype, why = resolve_decode_dtype("auto", "cpu")
    assert dtype is None and "AVX2" in why
    dtype, why = resolve_decode_dtype("bfloat16", "cpu")
    assert dtype is torch.bfloat16 and "emulated" in why
    with pytest.raises(ValueError, match="decode_dtype"):
        resolve_decode_dtype("fp16", "cpu")
    assert EngineConfig().decode_dtype == "float32"  # the default; the quickstart preset measured and set auto


def test_the_copy_is_the_merged_model_and_follows_every_weight_change():
    model = lora_model()
    copies = DecodeCopy(torch.bfloat16)
    copies.packs = False  # parameters compared one by one: plain ones (packed: test_packed_linear.py)
    made = copies.get(model, version=1)
    expected = dict(merged_bf16(model).named_parameters())
    assert {n: p.dtype for n, p in made.named_parameters()} == {n: torch.bfloat16 for n in expected}
    assert all(torch.equal(p, expected[n]) for n, p in made.named_parameters())
    with torch.no_grad():  # an update: adapters and a base weight change
        for name, p in model.named_parameters():
            if "lora_A" in name or name.endswith("layers.0.mlp.down_proj.base_layer.weight"):
                p.add_(0.01)
    assert copies.get(model, version=1) is made and copies.refreshes == 0  # the same version: nothing done
    assert copies.get(model, version=2) is made and (copies.builds, copies.refreshes) == (1, 1)  # merged in place
    expected = dict(merged_bf16(model).named_parameters())
    assert all(torch.equal(p, expected[n]) for n, p in made.named_parameters())
    plain = load_model("tiny-random").to(torch.bfloat16)
    assert copies.get(plain, version=3) is plain  # weights in bf16 already: no copy


def generate(engine, **kw):
    return engine.generate_sync(PROMPTS, SamplingParams(max_tokens=8, **kw))


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "top_p": 0.9, "seed": 5}])
def test_the_engine_samples_what_a_bf16_model_of_the_merged_weights_samples(sampling):
    model, tokenizer = lora_model(), load_tokenizer("tiny-random")
    engine = HFEngine(model, tokenizer, decode_dtype="bfloat16")
    reference = HFEngine(merged_bf16(model), tokenizer)
    assert generate(engine, **sampling) == generate(reference, **sampling)
    fp32 = HFEngine(model, tokenizer, decode_dtype="float32")
    assert fp32.decode_copy is None and engine.decode_copy is not None
    with torch.no_grad():  # an update between calls: the next call decodes with the new weights
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(-3.0)
    reference = HFEngine(merged_bf16(model), tokenizer)
    assert generate(engine, **sampling) == generate(reference, **sampling)
    assert engine.decode_copy.refreshes == 1


def test_the_parity_probe_expects_bf16_logprobs_from_a_bf16_decode(monkeypatch):
    from ctu.config.schema import load_config
    from ctu.train.sync import parity_dtypes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CTU_NATIVE_BF16", "1")
    auto = ["engine.decode_dtype=auto"]
    assert parity_dtypes(load_config("configs/quickstart.yaml", auto)) == ("float32", "bfloat16")
    assert parity_dtypes(load_config("configs/quickstart.yaml", ["engine.decode_dtype=float32"])) == ("float32",) * 2
    monkeypatch.setenv("CTU_NATIVE_BF16", "0")
    assert parity_dtypes(load_config("configs/quickstart.yaml")) == ("float32", "float32")


def test_a_released_copy_frees_its_weights_and_comes_back_merged_without_a_new_copy():
    model = lora_model()
    copies = DecodeCopy(torch.bfloat16)
    copies.packs = False  # parameters compared one by one: plain ones (packed: test_packed_linear.py)
    made = copies.get(model, version=1)
    before = sum(p.untyped_storage().nbytes() for p in made.parameters())
    copies.release()
    assert all(p.untyped_storage().nbytes() == 0 for p in made.parameters())  # the memory is given back
    assert before > 0
    with torch.no_grad():  # the update the copy was released for
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.02)
    assert copies.get(model, version=2) is made and copies.builds == 1  # the same modules, filled again
    expected = dict(merged_bf16(model).named_parameters())
    assert all(torch.equal(p, expected[n]) for n, p in made.named_parameters())
    copies.release()
    assert copies.get(model, version=2) is made and copies.refreshes == 2  # the same version, but nothing held: filled


def test_the_engine_idles_through_an_update_and_samples_the_new_weights_after():
    model, tokenizer = lora_model(), load_tokenizer("tiny-random")
    engine = HFEngine(model, tokenizer, decode_dtype="bfloat16")
    sampling = {"temperature": 1.0, "top_p": 0.9, "seed": 5}
    generate(engine, **sampling)
    engine.idle()
    assert all(p.untyped_storage().nbytes() == 0 for p in engine.decode_copy.model.parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(-3.0)
    assert generate(engine, **sampling) == generate(HFEngine(merged_bf16(model), tokenizer), **sampling)

