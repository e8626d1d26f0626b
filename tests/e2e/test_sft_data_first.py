"""Every problem with the warm start's data shows before any model loads, any evaluation runs or run.dir changes;
the data file is read once."""

import json

import pytest

import ctu.app.trainer as trainer_module
from ctu.app.trainer import Trainer
from ctu.config.schema import ConfigError, load_config
from ctu.episode.data import sft


def config(run_dir, *extra):
    return load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={run_dir}", "trainer.export=false", "trainer.max_steps=1",
        "trainer.sft_steps=2", "trainer.sft_batch_size=2", "trainer.sft_exclude=[]", *extra])


def chat_line(user: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "Done."}]})


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the data was checked")

    monkeypatch.setattr(trainer_module, "build_trainer_group", refuse)


@pytest.mark.parametrize("data", [True, False], ids=["sft_data", "gold"])
def test_nothing_left_to_train_on_fails_before_any_model_loads_or_run_dir_changes(tmp_path, no_model, data):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')  # a previous run that run.overwrite would remove
    file = tmp_path / "sft.jsonl"
    file.write_text("\n".join(chat_line("x " * 3000) for _ in range(3)) + "\n")
    extra = [f"trainer.sft_data={file}"] if data else ["env.max_context_tokens=128"]
    with pytest.raises(ConfigError, match="nothing is left to train on") as info:
        Trainer(config(run, "run.overwrite=true", *extra))
    assert (str(file) in str(info.value)) == data
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n' and (run / "checkpoints").is_dir()


def test_a_bad_data_file_fails_before_any_model_loads_naming_file_and_line(tmp_path, no_model):
    file = tmp_path / "sft.json"
    file.write_text(json.dumps([json.loads(chat_line("hi"))]) + "\n" + chat_line("dropped before") + "\n")
    with pytest.raises(ConfigError, match=rf"^trainer\.sft_data: {file}:2: content after the JSON array"):
        Trainer(config(tmp_path / "run", f"trainer.sft_data={file}"))


def test_the_data_file_is_read_once_and_its_samples_reach_the_warm_start(tmp_path, monkeypatch):
    file = tmp_path / "sft.jsonl"
    file.write_text("\n".join(chat_line(u) for u in ("Where is my order?", "Hi", "Cancel it")) + "\n")
    reads, real_read = [], sft.read_conversations

    def counting(path):
        reads.append(path)
        return real_read(path)

    monkeypatch.setattr(sft, "read_conversations", counting)
    trainer = Trainer(config(tmp_path / "run", f"trainer.sft_data={file}", "trainer.eval_before_train=false"))
    seen = []
    trainer.group.sft = lambda demos, batches, on_step=None: seen.append(len(demos)) or 1.0
    trainer.sync_weights = lambda: None
    try:
        assert trainer.warm_start() == 1.0
    finally:
        trainer.lock.release()
    assert seen == [3] and len(reads) == 1
