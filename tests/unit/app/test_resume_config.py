"""Resuming with a setting that shapes the checkpoint's tensors (LoRA's rank, whether LoRA is on, its target modules)
changed is refused before any model loads, naming the key and both values (it used to fail inside the load with a
tensor size mismatch)."""

import json

import pytest

from ctu.app.resume import prepare_resume
from ctu.config.schema import ConfigError, load_config, save_config


def a_run(tmp_path, *settings):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    (run / "checkpoints" / "step_1" / "checkpoint.json").write_text(json.dumps({"step": 1}))
    save_config(load_config(None, [f"run.dir={run}", *settings]), run / "config.yaml")
    return run


@pytest.mark.parametrize("before, after, message", [
    ("lora.rank=16", "lora.rank=8", "lora.rank is 8, the checkpoint's run had 16"),
    ("lora.enabled=true", "lora.enabled=false", "lora.enabled is false, the checkpoint's run had true"),
    ("lora.target_modules=[q_proj]", "lora.target_modules=[q_proj, v_proj]",
     "lora.target_modules is [\"q_proj\", \"v_proj\"], the checkpoint's run had [\"q_proj\"]"),
])
def test_resuming_with_another_tensor_shape_is_refused_naming_the_key(tmp_path, before, after, message):
    run = a_run(tmp_path, before)
    config = load_config(None, [f"run.dir={run}", "trainer.resume=latest", after])
    with pytest.raises(ConfigError) as info:
        prepare_resume(config)
    assert str(info.value) == (f"trainer.resume: {message} ({run / 'config.yaml'}); its weights have that shape: "
                               f"resume with the checkpoint's value, or start a new run.dir")


def test_resuming_with_other_settings_changed_goes_on(tmp_path):
    run = a_run(tmp_path, "lora.rank=16", "trainer.lr=1e-5")
    assert prepare_resume(load_config(None, [f"run.dir={run}", "trainer.resume=latest", "lora.rank=16",
                                             "trainer.lr=2e-5", "trainer.max_steps=40"])) is None
