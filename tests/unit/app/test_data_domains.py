"""A domain named by a data file (a transcript line, a trajectory, a parquet row) is looked up among the built-in
domains and those the command line names; a ``package.module:function`` in the data is never imported or called."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctu.app.cli import main
from ctu.domains import get_domain, registered_domain
from ctu.episode.transcripts import gold_transcript

MINI = get_domain("mini")
TASK = MINI.tasks[0]
HOSTILE = ["shutil:rmtree", "sys:exit", "os:listdir", "this:x", "os:system"]


def line(domain, **more) -> str:
    return json.dumps({"task_id": TASK.id, "domain": domain, "messages": gold_transcript(MINI, TASK), **more})


def victim(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "keep.txt").write_text("x")
    return folder


@pytest.mark.parametrize("name", HOSTILE)
def test_score_never_imports_a_transcript_lines_domain(tmp_path, capsys, name):
    data = victim(tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_text(line(name) + "\n" + line("mini") + "\n")
    code = main(["score", str(path), "--data-dir", str(data), "--json"])
    out, err = capsys.readouterr()
    assert (data / "keep.txt").is_file()  # shutil:rmtree deleted --data-dir
    assert code == 1  # sys:exit made it exit 0, the rest unread
    assert "Zen of Python" not in out and "Beautiful is better" not in out  # this:x printed into --json
    assert f"{path}:1: error: unknown domain '{name}'" in err, err
    rows = [json.loads(x) for x in out.splitlines()]
    assert rows[1]["line"] == 2 and rows[1]["reward"] == 1.0  # the next line is still scored (os:listdir stopped it)


@pytest.mark.parametrize("name", HOSTILE)
def test_data_export_never_imports_a_trajectorys_domain(tmp_path, capsys, name):
    data = victim(tmp_path)
    run = tmp_path / "evalrun"
    run.mkdir()
    (run / "trajectories.jsonl").write_text(line(name, reward=1.0) + "\n")
    out = tmp_path / "out" / "o.jsonl"
    code = main(["data", "export", "--trajectories", str(run), "--format", "openai", "--out", str(out),
                 "--data-dir", str(data)])
    err = capsys.readouterr().err
    assert (data / "keep.txt").is_file()
    assert code == 1 and not out.exists()
    assert f"trajectories.jsonl:1: domain '{name}' is not built in" in err, err


def test_a_custom_domain_named_on_the_command_line_is_found():
    spec = "tests.support.word_domain:load"
    assert registered_domain(spec, registered=[spec]).name == get_domain(spec).name
    with pytest.raises(KeyError, match="never by a data file"):
        registered_domain(spec)


@pytest.mark.parametrize("name", [*HOSTILE, 3, None, ["mini"], "../mini"])
def test_registered_domain_refuses_what_is_not_registered(name):
    with pytest.raises(KeyError, match="unknown domain"):
        registered_domain(name)
    assert registered_domain("mini").name == "mini"


def test_a_parquet_rows_domain_is_a_built_in_one():
    from ctu.app.integrations.common import task_of
    from ctu.episode.data.prompts import task_to_tau2

    truth = json.dumps(task_to_tau2(TASK))
    assert task_of(truth, {"domain": "mini"})[0].name == "mini"
    with pytest.raises(KeyError, match="unknown domain 'os'"):
        task_of(truth, {"domain": "os"})


@pytest.mark.parametrize("data", [b"", b"\n\n  \n"])
def test_an_empty_transcript_file_is_exit_1_in_one_line(tmp_path, capsys, data):
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    assert main(["score", str(path), "--domain", "mini"]) == 1
    out, err = capsys.readouterr()
    assert err == f"{path}: error: no transcript in it (empty, or blank lines only)\n" and out == ""
