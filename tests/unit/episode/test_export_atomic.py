"""Exports are written whole or not at all: a refused export (telecom to sharegpt) is one line and touches no
file; a failure while writing leaves the previous file as it was and no temporary behind."""

import json

import pytest

from ctu.app.cli import main
from ctu.domains import get_domain
from ctu.episode.data import sft
from ctu.episode.data.conversations import DataError, gold_conversations
from ctu.episode.data.prompts import task_rows, write_prompts
from ctu.episode.data.sft import write_conversations


def files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_telecom_to_sharegpt_is_refused_in_one_line_before_any_file_is_touched(tmp_path, capsys):
    out = tmp_path / "data"
    assert main(["data", "export", "--domain", "mini", "--format", "sharegpt", "--out", str(out / "t.jsonl")]) == 0
    before = files(out)
    capsys.readouterr()
    assert main(["data", "export", "--domain", "telecom", "--format", "sharegpt", "--out", str(out / "t.jsonl")]) == 1
    assert main(["data", "export", "--domain", "telecom", "--format", "sharegpt",
                 "--out", str(tmp_path / "new" / "t.jsonl")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0] == err[1]
    assert err[0].startswith("ctu: error: task ") and err[0].endswith("use --format openai, which holds any conversation")
    assert files(out) == before  # the earlier export and its dataset_info.json are untouched
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("fmt", ["openai", "sharegpt"])
def test_a_failure_while_writing_keeps_the_previous_file(tmp_path, monkeypatch, fmt):
    mini = get_domain("mini")
    conversations = gold_conversations(mini, mini.split("train")[:5])
    write_conversations(tmp_path / "d.jsonl", conversations[:2], fmt)
    before = files(tmp_path)
    real, calls = json.dumps, []

    def failing(obj, *a, **k):  # the disk fills up after the first record
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(obj, *a, **k)

    monkeypatch.setattr(sft.json, "dumps", failing)
    with pytest.raises(OSError, match="No space left"):
        write_conversations(tmp_path / "d.jsonl", conversations, fmt)
    assert files(tmp_path) == before  # no half-written file, no temporary left


def test_a_failed_parquet_write_keeps_the_previous_file(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    mini = get_domain("mini")
    write_prompts(tmp_path / "p.parquet", task_rows(mini, mini.split("all")[:2]))
    before = files(tmp_path)
    real = pq.write_table

    def half(table, where, *a, **k):
        where.write(b"PAR1 half")  # ctu hands pyarrow an open file
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", half)
    with pytest.raises(OSError):
        write_prompts(tmp_path / "p.parquet", task_rows(mini, mini.split("all")[:3]))
    monkeypatch.setattr(pq, "write_table", real)
    assert files(tmp_path) == before


def test_a_conversation_sharegpt_cannot_hold_names_the_way_out():
    telecom = get_domain("telecom")
    with pytest.raises(DataError, match="use --format openai, which holds any conversation$"):
        write_conversations("/nonexistent-dir/never-written.jsonl", gold_conversations(telecom, telecom.split("all")),
                            "sharegpt")
