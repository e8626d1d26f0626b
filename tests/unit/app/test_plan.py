"""ctu.app.plan: parameter formulas equal real random models; the plan moves the right way; presets are refused
or accepted on the hardware their comments name."""

from pathlib import Path

import pytest

from ctu.app.plan import (
    ARCHITECTURES,
    LOGIT_BUDGET,
    Arch,
    arch_from_config,
    check_fits,
    lora_parameter_count,
    main,
    parameter_count,
    plan,
)
from ctu.config.schema import load_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
SEVEN_B = str(CONFIGS / "qwen2.5-7b-multidomain.yaml")


def _cfg(path=None, *overrides):
    return load_config(path, list(overrides))


@pytest.mark.parametrize("arch,extra", [
    ("qwen2", {"tie_word_embeddings": True}),
    ("qwen2", {"tie_word_embeddings": False}),
    ("llama", {"tie_word_embeddings": False, "head_dim": 24}),
    ("qwen3", {"tie_word_embeddings": False, "head_dim": 16}),
])
def test_parameter_count_equals_random_model(arch, extra):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
           "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]
    hf = cls[0](vocab_size=1000, hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
                num_key_value_heads=2, **extra)
    torch.manual_seed(0)
    model = cls[1](hf)
    real = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert parameter_count(arch_from_config(hf.to_dict())) == real


def test_lora_count_equals_peft():
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf = Qwen2Config(vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    torch.manual_seed(0)
    model = get_peft_model(Qwen2ForCausalLM(hf), LoraConfig(r=8, target_modules=targets))
    real = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora_parameter_count(arch_from_config(hf.to_dict()), 8, targets) == real


def test_table_matches_published_sizes_and_logit_budget():
    published = {"qwen2.5-3b": 3.09e9, "qwen2.5-7b": 7.62e9, "qwen3-4b": 4.02e9, "qwen3-8b": 8.19e9,
                 "smollm2-135m": 1.35e8, "qwen2.5-0.5b": 4.94e8, "qwen2.5-1.5b": 1.54e9}
    for name, size in published.items():
        assert parameter_count(ARCHITECTURES[name]) == pytest.approx(size, rel=0.01), name
    from ctu.config.schema import Config
    from ctu.train.logprobs import LOGIT_BUDGET as TRAINER_BUDGET

    assert LOGIT_BUDGET == TRAINER_BUDGET == Config().trainer.logit_chunk_mib * 2**20 // 4


def test_local_config_json_is_read(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, '
                                          '"num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 100}')
    p = plan(_cfg(None, f"model.path={tmp_path}"), 1, 8.0)
    assert p.parameters == parameter_count(Arch(32, 2, 4, 4, 64, 100, False))
    with pytest.raises(ValueError, match="unknown architecture"):
        plan(_cfg(None, "model.path=someone/NotAModel-1B"), 1, 8.0)


def test_more_gpus_less_per_gpu():
    one, two, eight = (plan(_cfg(SEVEN_B), n, 80.0) for n in (1, 2, 8))
    for key in ("weights (fp32 masters)", "gradients (fp32)", "optimizer state (AdamW, fp32)"):
        assert one.parts[key] > two.parts[key] > eight.parts[key]
        assert two.parts[key] == pytest.approx(one.parts[key] / 2, rel=1e-6)
    assert one.total > two.total > eight.total


def test_lora_much_smaller_than_full_and_checkpointing_reduces_activations():
    full = plan(_cfg(SEVEN_B), 1, 80.0)
    lora = plan(_cfg(SEVEN_B, "lora.enabled=true"), 1, 80.0)
    assert lora.trainable < 0.05 * full.trainable
    assert lora.parts["optimizer state (AdamW, fp32)"] < 0.05 * full.parts["optimizer state (AdamW, fp32)"]
    assert lora.train_total < 0.5 * full.train_total
    ckpt = plan(_cfg(SEVEN_B, "trainer.gradient_checkpointing=true"), 1, 80.0)
    plain = plan(_cfg(SEVEN_B, "trainer.gradient_checkpointing=false"), 1, 80.0)
    on = next(v for k, v in ckpt.parts.items() if k.startswith("activations"))
    off = next(v for k, v in plain.parts.items() if k.startswith("activations"))
    assert on < 0.25 * off
    assert ckpt.activations_other[1] == off and plain.activations_other[1] == on


def test_colocated_vllm_counts_only_while_rolling_out():
    colocated = plan(_cfg(SEVEN_B), 8, 80.0)
    awake = plan(_cfg(SEVEN_B, "engine.colocated=false"), 8, 80.0)
    fraction = int(0.4 * 80 * 2**30)
    assert awake.train_total - colocated.train_total == pytest.approx(fraction - 2**30, rel=0.1)
    assert awake.rollout_total == colocated.rollout_total
    tiny = plan(_cfg(SEVEN_B, "engine.gpu_memory_utilization=0.2"), 8, 80.0)
    assert not tiny.fits and "vLLM KV cache" in tiny.problems[0]


def test_check_fits_refuses_7b_full_on_one_80gb_and_accepts_the_named_hardware():
    with pytest.raises(ValueError, match=r"does not fit on 1 x 80 GiB: .*short by") as err:
        check_fits(_cfg(SEVEN_B), 1, 80.0)
    assert "\n" not in str(err.value)
    assert check_fits(_cfg(SEVEN_B), 4, 79.0).fits
    with pytest.raises(ValueError, match="short by"):
        check_fits(_cfg(SEVEN_B), 2, 79.0)


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_preset_passes_on_the_hardware_its_comment_names(name, capsys):
    import re

    header = "\n".join(ln for ln in (CONFIGS / name).read_text().splitlines() if ln.startswith("#"))
    hardware = re.findall(r"(\d+)x(\d+(?:\.\d+)?) GiB", header)  # "# hardware: 4x79 GiB (...) or 2x139 GiB"
    if name == "quickstart.yaml":  # CPU preset: printed, no GPU claim
        assert not hardware and main([str(CONFIGS / name)]) == 0
        return
    assert "# hardware:" in header and hardware, f"{name} names no hardware"
    for gpus, memory in hardware:
        assert main([str(CONFIGS / name), "--gpus", gpus, "--gpu-memory", memory]) == 0, (name, gpus, memory)
        assert capsys.readouterr().out.rstrip().endswith("fits")
    assert main([str(CONFIGS / name), "--gpus", "1", "--gpu-memory", "16"]) == 1  # and it can fail


def test_async_hf_counts_the_producers_model_copy_in_every_phase():
    """trainer.max_staleness > 0 with the in-process hf engine: the engine runs a merged copy of the policy (the
    optimizer must not move weights under a rollout) and keeps generating through the update, so its copy and KV
    caches count while training too; a config that fits synchronously can then be refused."""
    common = ("engine.kind=hf", "model.path=Qwen/Qwen2.5-3B-Instruct", "model.dtype=bfloat16")
    sync = plan(_cfg(None, *common), 1, 80.0)
    k1 = plan(_cfg(None, *common, "trainer.max_staleness=1", "trainer.tis_cap=2.0"), 1, 80.0)
    copy = k1.parts["async: the producer's model copy (compute dtype)"]
    assert copy == 2 * sync.parameters
    assert k1.rollout_total - sync.rollout_total == pytest.approx(copy * 1.05, rel=0.01)
    assert k1.train_total - sync.train_total > copy  # + the KV caches of the generation beside the update
    assert any("max_staleness=1" in note for note in k1.notes)
    small = 1.05 * sync.train_total / 2**30  # enough for the synchronous run, not the asynchronous one
    assert plan(_cfg(None, *common), 1, small).fits
    assert not plan(_cfg(None, *common, "trainer.max_staleness=1", "trainer.tis_cap=2.0"), 1, small).fits


def test_a_launched_served_engine_counts_its_fraction_in_every_phase_and_an_attached_one_nowhere():
    """engine.launch=true with engine.colocated=false starts vLLM on the trainer's GPU with
    engine.gpu_memory_utilization and it never sleeps: its fraction counts while training too (a colocated
    in-process vLLM's counts only while rolling out). An attached server (engine.base_url) is elsewhere."""
    colocated = plan(_cfg(SEVEN_B), 8, 80.0)
    launched = plan(_cfg(SEVEN_B, "engine.kind=served", "engine.launch=true", "engine.colocated=false"), 8, 80.0)
    attached = plan(_cfg(SEVEN_B, "engine.kind=served", "engine.base_url=http://127.0.0.1:8000/v1"), 8, 80.0)
    fraction = int(0.4 * 80 * 2**30)
    assert launched.train_total - colocated.train_total == pytest.approx(fraction - 2**30, rel=0.1)
    assert any("stays awake through updates" in note for note in launched.notes) and launched.host_pinned == 0
    assert "vLLM KV cache" not in attached.parts and attached.train_total < launched.train_total
    small = plan(_cfg(SEVEN_B, "engine.kind=served", "engine.launch=true", "engine.gpu_memory_utilization=0.2"), 8, 80.0)
    assert not small.fits and "vLLM KV cache" in small.problems[0]


def test_a_launched_colocated_served_engine_sleeps_through_updates_on_cuda_and_not_on_cpu():
    """engine.launch=true beside the trainer (engine.colocated, the default) on CUDA: the server sleeps at level 1
    (--enable-sleep-mode; POST /sleep?level=1), so its fraction counts in the rollout phase only, as a colocated
    in-process vLLM's does; its bf16 weights are pinned in host RAM meanwhile (level 1 keeps them). vLLM's CPU
    platform has no sleep mode: the plan says the server stays awake there."""
    in_process = plan(_cfg(SEVEN_B), 8, 80.0)
    launched = plan(_cfg(SEVEN_B, "engine.kind=served", "engine.launch=true"), 8, 80.0)
    awake = plan(_cfg(SEVEN_B, "engine.kind=served", "engine.launch=true", "engine.colocated=false"), 8, 80.0)
    assert launched.train_total == in_process.train_total < awake.train_total
    assert launched.rollout_total == awake.rollout_total
    assert launched.host_pinned == 2 * launched.parameters and in_process.host_pinned == 0  # level 1 vs level 2
    assert any("sleeps at level 1 during updates" in note for note in launched.notes)
    on_cpu = plan(_cfg(SEVEN_B, "engine.kind=served", "engine.launch=true"), 1, 80.0, device="cpu")
    assert any("no sleep mode" in note and "stays awake" in note for note in on_cpu.notes)
