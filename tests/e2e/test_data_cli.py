"""`ctu data export/import` end to end, RFT data from an eval run, the warm start trained from an exported file,
and what a training run shows of its evaluations (history, curves.png, the closing table)."""

import asyncio
import json

import pytest

from ctu.app import trainer as trainer_module
from ctu.app.cli import main
from ctu.app.evaluate import write_report
from ctu.app.trainer import Trainer
from ctu.config.schema import ConfigError, load_config
from ctu.engines.base import SamplingParams
from ctu.episode.data.sft import read_conversations
from ctu.episode.users.scripted import ScriptedUser
from ctu.observe.tracking import read_evals
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout
from ctu.train.demos import gold_samples
from tests.unit.rollout.test_rollout import GOLD_TURNS, MINI, TASK, ScriptedModel


def test_export_import_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "data"
    assert main(["data", "export", "--domain", "mini", "--format", "openai", "--out", str(out / "gold.jsonl")]) == 0
    assert main(["data", "export", "--domain", "airline", "--format", "sharegpt", "--out", str(out / "a.jsonl"),
                 "--name", "ctu_airline"]) == 0
    assert main(["data", "export", "--domain", "mini", "--split", "all", "--format", "parquet",
                 "--out", str(out / "mini.parquet")]) == 0
    assert main(["data", "import", str(out / "mini.parquet"), "--out", str(out / "tasks")]) == 0
    printed = capsys.readouterr().out
    assert "wrote 240 gold demonstrations of mini (split train)" in printed
    assert f"LLaMA-Factory: dataset 'ctu_airline' in {out / 'dataset_info.json'}" in printed
    assert f"use them with env.tasks.mini={out / 'tasks' / 'mini' / 'tasks.json'}" in printed
    assert len(read_conversations(out / "gold.jsonl")) == 240 and len(read_conversations(out / "a.jsonl")) == 30
    from ctu.rollout.components import build_domains

    (domain,) = build_domains(load_config(None, [f"env.tasks.mini={out / 'tasks' / 'mini' / 'tasks.json'}"]))
    assert list(domain.tasks) == list(MINI.tasks) and dict(domain.splits) == dict(MINI.splits)
    main(["score", str(out / "gold.jsonl")])  # gold demonstrations re-score to 1
    assert "scored 240 transcript(s), mean reward 1.000; 0 bad line(s)" in capsys.readouterr().out


def test_export_mistakes_are_one_line(tmp_path, capsys):
    assert main(["data", "export", "--format", "openai", "--out", str(tmp_path / "x.jsonl")]) == 1
    assert main(["data", "export", "--trajectories", str(tmp_path), "--format", "parquet",
                 "--out", str(tmp_path / "x.parquet")]) == 1
    assert main(["data", "import", str(tmp_path / "none.parquet"), "--out", str(tmp_path)]) == 1
    errors = capsys.readouterr().err.splitlines()
    assert errors == ["ctu: error: give either --domain (gold demonstrations / tasks) or --trajectories (an eval run)",
                      "ctu: error: parquet holds tasks (prompts), not conversations: export it with --domain",
                      f"ctu: error: {tmp_path / 'none.parquet'}: no such parquet file"]


def test_rft_data_is_the_successful_episodes_of_an_eval_run(tmp_path, capsys, chat_format):
    """Three episodes of one task: two fail, one succeeds; only the success is exported, as it was played."""
    failing = ScriptedModel(chat_format, GOLD_TURNS[:1] + ["Sorry, no."] * 3)
    bad = asyncio.run(rollout([EpisodeSpec(MINI, TASK, 0), EpisodeSpec(MINI, TASK, 1)], chat_format, failing,
                              ScriptedUser(), SamplingParams(), RolloutLimits()))
    good = asyncio.run(rollout([EpisodeSpec(MINI, TASK, 2)], chat_format, ScriptedModel(chat_format, GOLD_TURNS),
                               ScriptedUser(), SamplingParams(), RolloutLimits()))
    write_report(tmp_path / "eval", bad + good)
    for fmt in ("openai", "sharegpt"):
        assert main(["data", "export", "--trajectories", str(tmp_path / "eval"), "--format", fmt,
                     "--out", str(tmp_path / f"rft_{fmt}.jsonl")]) == 0
    assert "wrote 1 of 3 episodes (reward >= 1.0)" in capsys.readouterr().out
    (conversation,) = read_conversations(tmp_path / "rft_openai.jsonl")
    assert [{k: v for k, v in m.items() if k != "weight"} for m in conversation.messages] == good[0].messages
    assert conversation.task_id == TASK.id and conversation.termination == "user_stop"
    (shared,) = read_conversations(tmp_path / "rft_sharegpt.jsonl")
    assert shared.messages == conversation.messages[:-1]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "trajectories.jsonl").write_text('{"domain": "mini"}\n')
    assert main(["data", "export", "--trajectories", str(tmp_path / "broken"), "--format", "openai",
                 "--out", str(tmp_path / "x.jsonl")]) == 1
    assert capsys.readouterr().err.strip() == (f"ctu: error: {tmp_path / 'broken' / 'trajectories.jsonl'}:1: "
                                               "field 'task_id' is missing (not a ctu trajectory)")


def config(run_dir, *extra):
    return load_config("configs/quickstart.yaml", [
        "model.path=tiny-random", f"run.dir={run_dir}", "trainer.tasks_per_step=2", "trainer.samples_per_task=2",
        "trainer.eval_max_tasks=2", "sampling.max_tokens=8", "env.max_turns=2", "trainer.eval_before_train=false",
        "trainer.export=false", "trainer.sft_steps=1", "trainer.sft_batch_size=2", "trainer.max_steps=1",
        "trainer.sft_exclude=[]", *extra])  # the exported file holds every gold demo


@pytest.fixture(scope="module")
def warm_started(tmp_path_factory):
    """One tiny-random trainer: the warm start's batch from gold demonstrations built in memory (recorded, not
    trained), then the same draw from an exported sharegpt file, trained for one step."""
    tmp_path = tmp_path_factory.mktemp("warm")
    assert main(["data", "export", "--domain", "mini", "--format", "sharegpt", "--out",
                 str(tmp_path / "gold.jsonl")]) == 0
    batches, losses = [], []
    trainer = Trainer(config(tmp_path / "run"))
    real = trainer.group.sft

    def spy(demos, draws, on_step=None):
        batches.append([(tuple(demos[i].ids), tuple(demos[i].mask)) for i in draws[0]])
        losses.append(real(demos, draws, on_step) if len(batches) == 2 else 0.0)
        return losses[-1]

    trainer.group.sft = spy
    trainer.warm_start()
    trainer.config.trainer.sft_data = str(tmp_path / "gold.jsonl")
    trainer.sync.version = -1  # warm-started again as a fresh run is: its weights sync as version 0
    trainer.warm_start()
    return trainer, batches, losses


def test_the_warm_start_trains_from_an_exported_file_on_the_same_tokens(warm_started):
    trainer, batches, losses = warm_started
    assert len(batches) == 2 and batches[0] == batches[1] and len(batches[0]) == 2
    assert losses[1] > 0 and all(any(mask) for _, mask in batches[1])
    gold = {(tuple(s.ids), tuple(s.mask)) for s in gold_samples(trainer.chat, MINI, MINI.split("train"))}
    assert set(batches[1]) <= gold


def test_an_evaluation_shows_a_progress_bar_and_is_recorded(warm_started, monkeypatch):
    trainer, *_ = warm_started
    bars = []
    real = trainer_module.progress_bar

    def spy(total, desc):
        bars.append((total, desc, []))
        context = real(total, desc)

        class Counting:
            def __enter__(self):
                done = context.__enter__()
                return lambda t: (bars[-1][2].append(t.task_id), done(t))

            def __exit__(self, *exc):
                return context.__exit__(*exc)

        return Counting()

    monkeypatch.setattr(trainer_module, "progress_bar", spy)
    out = trainer.evaluate("after_sft")
    assert bars == [(2, "eval after_sft", [t.id for t in MINI.split("test")[:2]])]
    (record,) = read_evals(trainer.run_dir)
    assert record["phase"] == "after_warm_start" and record["step"] == 0 and record["episodes"] == 2
    assert record["success"] == {"mini": out["eval/mini/success"], "overall": out["eval/overall/success"]}


def test_a_bad_sft_file_fails_before_any_model_loads(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}\n{oops\n')
    monkeypatch.setattr(trainer_module, "build_trainer_group", lambda *_a, **_k: pytest.fail("a model was loaded"))
    with pytest.raises(ConfigError, match=rf"trainer\.sft_data: {bad}:2: not valid JSON"):
        Trainer(config(tmp_path / "run", f"trainer.sft_data={bad}"))
    assert main(["train", "configs/quickstart.yaml", "model.path=tiny-random", f"run.dir={tmp_path / 'r'}",
                 f"trainer.sft_data={tmp_path / 'missing.jsonl'}"]) == 1
    assert capsys.readouterr().err.strip() == (f"ctu: config error: trainer.sft_data: file {tmp_path / 'missing.jsonl'} "
                                               "does not exist")


@pytest.mark.slow
def test_a_run_records_every_evaluation_and_shows_them(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "configs/quickstart.yaml", "model.path=tiny-random", f"run.dir={run_dir}",
                 "trainer.tasks_per_step=1", "trainer.samples_per_task=2", "trainer.eval_max_tasks=2",
                 "sampling.max_tokens=4", "env.max_turns=1", "trainer.export=false", "trainer.sft_steps=1",
                 "trainer.sft_batch_size=1", "trainer.max_steps=2", "trainer.eval_interval=1"]) == 0
    evals = read_evals(run_dir)
    assert [(e["phase"], e["step"], e["tag"]) for e in evals] == [
        ("before", 0, "step_0"), ("after_warm_start", 0, "after_sft"), ("periodic", 1, "step_1"),
        ("final", 2, "step_2")]
    assert all(e["episodes"] == 2 and set(e["success"]) == {"mini", "overall"} for e in evals)
    assert [e["started"] for e in evals] == sorted(e["started"] for e in evals)
    out = capsys.readouterr().out
    table = out[out.index("held-out success"):]
    assert "before training" in table and "after warm start" in table and "final" in table
    assert "1 periodic evaluation(s)" in table and "overall: " in table
    assert (run_dir / "curves.png").stat().st_size > 10_000
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[0]["eval/overall/success"] == evals[2]["success"]["overall"]  # was eval/eval/overall/success


def test_banking_knowledge_gold_demonstrations_and_tasks_export(tmp_path, capsys, tau2_bench_data):
    """SFT data: 97 gold demonstrations (the scripted user runs its own gold calls), each scoring 1.0 again; and the
    tasks as a parquet prompt dataset with their initial state and user tools."""
    from ctu.domains import get_domain
    from ctu.episode.data.prompts import read_prompts
    from ctu.episode.data.sft import read_conversations
    from ctu.episode.reward import score_transcript

    out = tmp_path / "bank.jsonl"
    assert main(["data", "export", "--domain", "banking_knowledge", "--split", "all", "--format", "openai",
                 "--data-dir", tau2_bench_data, "--out", str(out)]) == 0
    assert "wrote 97 gold demonstrations of banking_knowledge (split all)" in capsys.readouterr().out
    bank = get_domain("banking_knowledge", tau2_bench_data)
    conversations = read_conversations(out)
    assert len(conversations) == 97 and [t["function"]["name"] for t in conversations[0].tools][0] == "KB_search"
    for conversation in conversations:
        task = bank.task(conversation.task_id)
        messages = [m for m in conversation.messages if m["role"] != "system"]
        assert score_transcript(bank, task, messages, conversation.termination or "user_stop").reward == 1.0, task.id
    assert main(["data", "export", "--domain", "banking_knowledge", "--split", "all", "--format", "parquet",
                 "--data-dir", tau2_bench_data, "--out", str(tmp_path / "bank.parquet")]) == 0
    tasks = read_prompts(tmp_path / "bank.parquet")["banking_knowledge"]["tasks"]
    assert tasks == list(bank.tasks)
