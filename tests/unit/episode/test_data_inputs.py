"""Hostile values inside data files are one error naming the file and line: a lone surrogate (JSON's "\\ud800",
which every tokenizer refuses), an integer longer than Python reads; ``ctu score`` reports a line nested too deeply
and scores the others; ``ctu data export --min-reward`` refuses a value that is not a number."""

import json

import pytest

from ctu.app.cli import main
from ctu.domains import get_domain
from ctu.episode.data.conversations import DataError
from ctu.episode.data.prompts import load_tasks
from ctu.episode.data.sft import read_conversations
from ctu.episode.transcripts import gold_transcript

GOOD = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
SURROGATE = GOOD.replace('"hi"', '"h\\ud800i"')
LONG_INT = GOOD.replace('"hello"}', '"hello", "n": ' + "9" * 100_000 + "}")


@pytest.mark.parametrize("bad, why", [(SURROGATE, "lone surrogate (\\ud800)"),
                                      (LONG_INT, "an integer with more digits than Python reads")])
@pytest.mark.parametrize("shape", ["jsonl", "array"])
def test_a_bad_value_in_sft_data_names_file_and_line(tmp_path, bad, why, shape):
    path = tmp_path / "sft.jsonl"
    path.write_text(f"{GOOD}\n{bad}\n{GOOD}\n" if shape == "jsonl" else f"[{GOOD},\n{bad},\n{GOOD}]\n")
    with pytest.raises(DataError) as info:
        read_conversations(path)
    assert str(info.value).startswith(f"{path}:2: ") and why in str(info.value)
    assert len(str(info.value)) < 200


def test_a_surrogate_pair_is_text(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(GOOD.replace('"hi"', '"\\ud83d\\ude00"') + "\n")
    assert read_conversations(path)[0].messages[0]["content"] == "\U0001f600"


def test_an_overlong_integer_in_a_tasks_file_names_it(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text("[\n" + "1" * 100_000 + "\n]\n")
    with pytest.raises(DataError, match=f"^{path}:2: an integer with more digits"):
        load_tasks(path)


def test_score_reports_a_line_nested_too_deeply_and_scores_the_rest(tmp_path, capsys):
    mini = get_domain("mini")
    task = mini.tasks[0]
    good = json.dumps({"task_id": task.id, "messages": gold_transcript(mini, task)})
    deep = json.dumps({"task_id": task.id, "messages": "X"}).replace('"X"', "[" * 100_000 + "]" * 100_000)
    path = tmp_path / "t.jsonl"
    path.write_text(f"{good}\n{deep}\n{SURROGATE}\n{good}\n")
    assert main(["score", "--domain", "mini", str(path)]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    errors = [line for line in captured.err.splitlines() if ": error: " in line]
    assert [e.split(": error: ")[0] for e in errors] == [f"{path}:2", f"{path}:3"]
    assert "nested too deeply" in errors[0] and "lone surrogate" in errors[1]
    assert "line 4 task" in captured.out


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_export_refuses_a_min_reward_that_is_not_a_finite_number(tmp_path, capsys, value):
    out = tmp_path / "o.jsonl"
    assert main(["data", "export", "--trajectories", str(tmp_path), "--format", "openai", "--out", str(out),
                 f"--min-reward={value}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"ctu: error: --min-reward: must be a finite number, got {value}"
    assert not out.exists()


def write_tasks_file(tmp_path, ids, splits=None):
    from ctu.episode.data.prompts import task_to_tau2

    mini = get_domain("mini")
    entries = [dict(task_to_tau2(mini.tasks[i]), id=task_id) for i, task_id in enumerate(ids)]
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(entries))
    if splits is not None:
        (tmp_path / "split_tasks.json").write_text(json.dumps(splits))
    return path


def test_a_task_id_given_twice_is_refused_naming_it(tmp_path):
    path = write_tasks_file(tmp_path, ["a", "b", "a", "c", "b"])
    with pytest.raises(DataError) as info:
        load_tasks(path)
    assert str(info.value) == f"{path}: task ids appear more than once: 'a' (tasks #0 and #2), 'b' (tasks #1 and #4)"


def test_train_and_test_splits_that_share_tasks_are_refused(tmp_path):
    path = write_tasks_file(tmp_path, ["a", "b", "c"], {"train": ["a", "b"], "test": ["b", "c"], "base": ["a", "b", "c"]})
    with pytest.raises(DataError) as info:
        load_tasks(path)
    assert str(info.value) == (f"{tmp_path / 'split_tasks.json'}: splits 'train' and 'test' share task 'b': an "
                               "evaluation on tasks trained on does not measure what was learned")


def test_a_task_named_twice_in_a_split_is_refused(tmp_path):
    path = write_tasks_file(tmp_path, ["a", "b"], {"train": ["a", "a"], "test": ["b"]})
    with pytest.raises(DataError, match="split 'train' names task 'a' twice"):
        load_tasks(path)
    write_tasks_file(tmp_path, ["a", "b"], {"train": ["a"], "test": ["b"], "base": ["a", "b"]})
    tasks, splits = load_tasks(path)
    assert [t.id for t in tasks] == ["a", "b"] and splits["base"] == ("a", "b")
