"""Every command fails with one line on stderr naming the problem, a non-zero exit and no traceback;
``--debug`` shows the traceback. ``ctu score`` scores every decodable line of a partly broken file."""

import importlib.util
import json

import pytest

from ctu.app import cli
from ctu.app.cli import main
from ctu.domains import get_domain
from ctu.episode.transcripts import gold_transcript


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err
    assert len(lines) == 1, err
    return lines[0]


def test_score_scores_every_decodable_line_and_names_the_undecodable_one(tmp_path, capsys):
    retail = get_domain("retail")
    task = retail.tasks[0]
    good = json.dumps({"task_id": task.id, "messages": gold_transcript(retail, task)}).encode()
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(good + b"\n" + b'{"task_id": "\xff\xfe"}\n' + good + b"\n")
    assert main(["score", "--domain", "retail", str(path), "--json"]) == 1
    captured = capsys.readouterr()
    rows = [json.loads(x) for x in captured.out.splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3]
    assert rows[0]["reward"] == 1.0 and rows[2]["reward"] == 1.0 and "UTF-8" in rows[1]["error"]
    errors = [line for line in captured.err.splitlines() if ": error: " in line]
    assert errors == [f"{path}:2: error: not valid UTF-8 (byte 0xff at offset 13 of the line)"]


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_score_on_a_missing_file_or_a_directory_is_one_line(tmp_path, capsys, kind):
    target = tmp_path / "nothing.jsonl" if kind == "missing" else tmp_path
    assert main(["score", "--domain", "mini", str(target)]) != 0
    line = one_error_line(capsys)
    assert str(target) in line and ("does not exist" if kind == "missing" else "is a directory") in line


def test_a_missing_model_is_one_line_naming_it(tmp_path, capsys):
    for argv in (["eval", "model.path=/nonexistent/model", f"run.dir={tmp_path}/e"],
                 ["play", "--domain", "mini", "--task", get_domain("mini").tasks[0].id, "--model", "/nonexistent/model",
                  f"run.dir={tmp_path}/p"]):
        assert main(argv) == 1, argv
        assert "/nonexistent/model" in one_error_line(capsys)


def test_missing_tau2_data_is_one_line_naming_the_domain_data(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("tau2_") else real(name, *a))
    monkeypatch.delenv("TAU2_DATA_DIR", raising=False)
    get_domain.cache_clear()
    try:
        assert main(["env", "check", "retail", "--data-dir", str(tmp_path)]) == 1
        line = one_error_line(capsys)
    finally:
        get_domain.cache_clear()
    assert "tau2 data for domain 'retail' not found" in line and str(tmp_path) in line


@pytest.mark.parametrize("which", ["user", "judge"])
def test_an_unset_api_key_is_one_line_naming_the_variable_not_a_value(tmp_path, capsys, monkeypatch, which):
    monkeypatch.delenv("CTU_TEST_UNSET_KEY", raising=False)
    settings = (["user.kind=llm", "user.api_key_env=CTU_TEST_UNSET_KEY"] if which == "user"
                else ["judge.enabled=true", "judge.api_key_env=CTU_TEST_UNSET_KEY"])
    argv = ["eval", "model.path=tiny-random", "eval.max_tasks=1", f"run.dir={tmp_path}", *settings]
    assert main(argv) == 1
    assert "environment variable CTU_TEST_UNSET_KEY is not set" in one_error_line(capsys)


def test_a_config_error_is_one_line_naming_the_key(tmp_path, capsys):
    for command in ("eval", "train"):
        assert main([command, "trainer.no_such_key=1", f"run.dir={tmp_path}"]) == 1
        assert "no_such_key" in one_error_line(capsys)


def test_train_exits_non_zero_on_any_failure(tmp_path, capsys, monkeypatch):
    class Broken:
        def __init__(self, config):
            raise RuntimeError("policy could not be built")

    import ctu.app.trainer

    monkeypatch.setattr(ctu.app.trainer, "Trainer", Broken)
    assert main(["train", "model.path=tiny-random", f"run.dir={tmp_path}"]) == 1
    assert one_error_line(capsys) == "ctu: error: policy could not be built"


def test_report_on_a_missing_run_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "no-run")]) == 1
    assert str(tmp_path / "no-run") in one_error_line(capsys)


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(FileNotFoundError, match="nonexistent"):
        main(["--debug", "eval", "model.path=/nonexistent/model", f"run.dir={tmp_path}"])
    with pytest.raises(FileNotFoundError, match="nonexistent"):
        main(["eval", "--debug", "model.path=/nonexistent/model", f"run.dir={tmp_path}"])


def test_one_line_collapses_multi_line_messages():
    assert cli._describe(ValueError("bad\n  value")) == "bad value"
    assert cli._describe(TypeError("x")) == "TypeError: x"
    assert cli._describe(KeyError("unknown task 'z'")) == "unknown task 'z'"
