"""Resuming what a run left behind: a finished run is not evaluated again, a longer one continues with one final
evaluation, and damaged records (a torn last line, a corrupt line) are repaired or refused before any model loads."""

import json
import shutil

import pytest

from ctu.app import trainer as trainer_module
from ctu.app.cli import main
from ctu.observe.tracking import eval_history_path, read_evals, read_metrics

RECORDS = ["metrics.jsonl", "eval/history.jsonl"]


def overrides(run_dir, steps, *extra):
    return ["configs/quickstart.yaml", "model.path=tiny-random", f"run.dir={run_dir}", f"trainer.max_steps={steps}",
            "trainer.tasks_per_step=1", "trainer.samples_per_task=2", "trainer.sft_steps=0",
            "trainer.eval_max_tasks=1", "sampling.max_tokens=4", "env.max_turns=1", "trainer.ckpt_interval=1",
            "trainer.eval_before_train=false", "trainer.export=false", *extra]


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    """A finished run of one step (checkpoint 1, its final evaluation at step 1)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", *overrides(run_dir, 1)]) == 0
    return run_dir


@pytest.fixture
def run_dir(one_step, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(one_step, copy, symlinks=True)
    return copy


def no_model_load(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(trainer_module, "build_trainer_group", refuse)


def snapshot(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".ctu.lock"}


def phases(run_dir):
    return [(e["phase"], e["step"]) for e in read_evals(run_dir)]


def test_resuming_a_finished_run_does_nothing_new(run_dir, monkeypatch, capsys):
    before = snapshot(run_dir)
    assert phases(run_dir) == [("final", 1)]
    no_model_load(monkeypatch)
    assert main(["train", *overrides(run_dir, 1, "trainer.resume=latest")]) == 0
    out, err = capsys.readouterr()
    assert out == (f"run.dir: {run_dir} is complete: checkpoint step 1 of trainer.max_steps=1 and its final "
                   "evaluation are recorded; nothing to do (raise trainer.max_steps to train further)\n"), out
    assert "error" not in err
    assert snapshot(run_dir) == before  # no second final evaluation, nothing rewritten


def test_resuming_a_finished_run_with_more_steps_evaluates_once_at_the_end(run_dir, capsys):
    assert main(["train", *overrides(run_dir, 2, "trainer.resume=latest")]) == 0
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    assert phases(run_dir) == [("periodic", 1), ("final", 2)]  # step 1's evaluation is no longer the last one
    table = capsys.readouterr().out.splitlines()
    assert [row.split()[1] for row in table if row.startswith("final ")] == ["2"], table  # one final row


def test_a_run_stopped_before_its_final_evaluation_gets_exactly_one(run_dir):
    eval_history_path(run_dir).write_text("")  # killed after the last checkpoint, before the final evaluation
    assert main(["train", *overrides(run_dir, 1, "trainer.resume=latest")]) == 0
    assert phases(run_dir) == [("final", 1)] and [r["step"] for r in read_metrics(run_dir)] == [1]


def test_torn_last_lines_are_dropped_before_the_model_loads(run_dir, monkeypatch, capsys):
    paths = [run_dir / name for name in RECORDS]
    kept = {path: path.read_bytes() for path in paths}
    for path in paths:
        path.write_bytes(kept[path] + b'{"step": 2, "rollout/rew')  # a full disk cut the last write short
    real = trainer_module.build_trainer_group

    def repaired_first(config):
        for path in paths:  # (history's final evaluation at step 1 is relabelled periodic by now)
            data = path.read_bytes()
            assert data.endswith(b"}\n") and data.count(b"\n") == kept[path].count(b"\n"), "the model loaded first"
        return real(config)

    monkeypatch.setattr(trainer_module, "build_trainer_group", repaired_first)
    assert main(["train", *overrides(run_dir, 2, "trainer.resume=latest")]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "torn" in line]
    assert notes == [f"ctu: warning: {path}: dropped a torn last line (24 bytes without a newline: a write cut "
                     "short); the rest is kept" for path in paths], err
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2] and phases(run_dir) == [("periodic", 1), ("final", 2)]


@pytest.mark.parametrize("name", RECORDS)
def test_a_corrupt_line_that_is_not_a_torn_tail_is_refused_naming_file_and_line(run_dir, monkeypatch, capsys, name):
    path = run_dir / name
    path.write_text('{"step": 1, "x": \n' + path.read_text())
    before = snapshot(run_dir)
    no_model_load(monkeypatch)
    assert main(["train", *overrides(run_dir, 2, "trainer.resume=latest")]) == 1
    err = capsys.readouterr().err
    assert err == f"ctu: error: {path}: line 1: not JSON (Expecting value at column 18)\n", err
    assert snapshot(run_dir) == before


def test_a_record_that_is_json_but_not_a_step_is_refused(run_dir, monkeypatch, capsys):
    path = run_dir / "metrics.jsonl"
    path.write_text(path.read_text() + json.dumps([1, 2]) + "\n")
    no_model_load(monkeypatch)
    assert main(["train", *overrides(run_dir, 2, "trainer.resume=latest")]) == 1
    assert f"{path}: line 2: not a record (a JSON object with an integer 'step')" in capsys.readouterr().err


def test_a_finished_run_resumed_to_export_is_exported_without_a_second_evaluation(run_dir, capsys):
    assert main(["train", *overrides(run_dir, 1, "trainer.resume=latest", "trainer.export=true")]) == 0
    assert phases(run_dir) == [("final", 1)] and (run_dir / "export" / "merged" / "config.json").is_file()
    capsys.readouterr()
    assert main(["train", *overrides(run_dir, 1, "trainer.resume=latest", "trainer.export=true")]) == 0
    assert capsys.readouterr().out.startswith(f"run.dir: {run_dir} is complete: ")  # now exported too
