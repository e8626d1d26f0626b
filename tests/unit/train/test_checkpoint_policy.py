import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ctu.config.schema import load_config
from ctu.train.checkpoint import list_checkpoints, load_checkpoint, resolve_resume, save_checkpoint
from ctu.train.policy import assert_precision_policy, build_policy, hf_name

segment = st.from_regex(r"[a-z_][a-z0-9_]{0,8}|[0-9]{1,2}", fullmatch=True).filter(
    lambda s: s not in {"lora_A", "lora_B", "base_layer", "modules_to_save"})
hf_names = st.lists(segment, min_size=1, max_size=6).map(".".join).map(lambda n: n + ".weight")


@given(hf_names)
def test_peft_names_map_back_to_hf_names(name):
    module, leaf = name.rsplit(".", 1)
    assert hf_name(f"base_model.model.{module}.base_layer.{leaf}") == name
    assert hf_name(f"base_model.model.{name}") == name
    assert hf_name(name) == name
    assert hf_name(f"base_model.model.{module}.lora_A.default.weight") is None
    assert hf_name(f"base_model.model.{module}.lora_B.default.weight") is None
    assert hf_name(f"base_model.model.{module}.modules_to_save.default.{leaf}") == name


def test_lora_policy_keeps_the_precision_policy_and_merged_names_are_plain(tmp_path):
    policy = build_policy(load_config(None, ["model.path=tiny-random"]), device="cpu")
    assert assert_precision_policy(policy.model, torch.float32) == torch.float32
    names = dict(policy.merged_named_tensors())
    from ctu.engines.hf.models import load_model

    plain = {n for n, _ in load_model("tiny-random", device="cpu").named_parameters()}
    assert set(names) == plain  # exactly the names vLLM / from_pretrained expect
    with torch.no_grad():  # a LoRA delta shows up in the merged weights
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)
    merged = dict(policy.merged_named_tensors())
    q = next(n for n in merged if n.endswith("q_proj.weight"))
    assert not torch.equal(merged[q], names[q])
    mixed = torch.nn.Linear(2, 2)
    mixed.bias.data = mixed.bias.data.to(torch.bfloat16)  # a trainable parameter that is not fp32
    with pytest.raises(TypeError, match="precision policy"):
        assert_precision_policy(mixed, torch.bfloat16)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)  # frozen fp32 under a bf16 compute dtype
    with pytest.raises(TypeError, match="frozen"):
        assert_precision_policy(frozen, torch.bfloat16)


def test_checkpoints_are_atomic_and_resume_skips_partial_writes(tmp_path):
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model=model, optimizer=opt, scheduler=sched, extra={"cursor": step}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_2", "step_3"]
    # a run killed while writing step 4 leaves a temp dir and maybe a dir without the completion marker
    (tmp_path / ".tmp-step_4-abc").mkdir()
    (tmp_path / ".tmp-step_4-abc" / "trainable.pt").write_bytes(b"partial")
    (tmp_path / "step_5").mkdir()
    latest = resolve_resume(tmp_path, "latest")
    assert latest.name == "step_3"
    step, extra = load_checkpoint(latest, model=model, optimizer=opt, scheduler=sched)
    assert step == 3 and extra == {"cursor": 3}
    assert json.loads((latest / "checkpoint.json").read_text())["step"] == 3
    with pytest.raises(FileNotFoundError):
        resolve_resume(tmp_path, str(tmp_path / "step_5"))
    assert resolve_resume(tmp_path / "nothing", "latest") is None


@pytest.mark.parametrize("override, message", [
    ("trainer.mini_batches=3 trainer.tasks_per_step=16",
     "trainer.mini_batches: 3 does not divide the rollout batch of 16"),
    ("trainer.advantage=grpo trainer.samples_per_task=1", "at least 2 samples"),
    ("trainer.resume=/no/such/dir", "trainer.resume"),
    ("trainer.micro_batch_tokens=0", "trainer.micro_batch_tokens: must be >= 1"),
])
def test_trainer_config_errors_name_the_key(override, message):
    from ctu.config.schema import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config("configs/quickstart.yaml", override.split())


def test_a_batch_baseline_needs_no_group():
    config = load_config("configs/quickstart.yaml", ["trainer.advantage=reinforce_pp", "trainer.samples_per_task=1"])
    assert config.trainer.samples_per_task == 1
