"""A tau2 data folder's tasks.json and split_tasks.json that cannot be read are one error naming the file and line
(``--data-dir``, ``env.tau2_data_dir``): not JSON, not UTF-8, too deep, an overlong integer, the wrong shape."""

import json

import pytest

from ctu.domains.tau2_data import read_tasks


@pytest.mark.parametrize("name, text, message", [
    ("tasks.json", b"\n", "tasks.json:2: not valid JSON (Expecting value at column 1)"),
    ("tasks.json", b"[\n\xff]", "tasks.json:2: not valid UTF-8"),
    ("tasks.json", b"[" * 100_000, "tasks.json:1: nested too deeply"),
    ("tasks.json", b"[\n" + b"1" * 5000 + b"]", "tasks.json:2: an integer with more digits than Python reads"),
    ("tasks.json", b"{}", "tasks.json: expected a JSON list of tau2 tasks, got dict"),
    ("split_tasks.json", b"[]", "split_tasks.json: expected a JSON object of split names to lists of task ids"),
    ("split_tasks.json", b'{"train": 3}', "split_tasks.json: split 'train' is not a list of task ids"),
])
def test_a_broken_data_file_names_itself(tmp_path, name, text, message):
    (tmp_path / "tasks.json").write_text("[]")
    (tmp_path / name).write_bytes(text)
    with pytest.raises(ValueError) as info:
        read_tasks(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / message.split(':')[0]}{message[len(message.split(':')[0]):]}"), \
        str(info.value)


def test_a_good_folder_reads(tmp_path):
    (tmp_path / "tasks.json").write_text("[]")
    (tmp_path / "split_tasks.json").write_text(json.dumps({"train": []}))
    assert read_tasks(tmp_path) == {"tasks": (), "splits": {"train": ()}}


def test_repeated_task_ids_and_train_test_overlap_are_refused(tmp_path):
    from ctu.domains import get_domain
    from ctu.episode.data.prompts import task_to_tau2

    mini = get_domain("mini")
    entries = [dict(task_to_tau2(mini.tasks[i]), id=task_id) for i, task_id in enumerate(["a", "b", "a"])]
    (tmp_path / "tasks.json").write_text(json.dumps(entries))
    with pytest.raises(ValueError, match=r"tasks.json: task ids appear more than once: 'a' \(tasks #0 and #2\)"):
        read_tasks(tmp_path)
    (tmp_path / "tasks.json").write_text(json.dumps(entries[:2]))
    (tmp_path / "split_tasks.json").write_text(json.dumps({"train": ["a", "b"], "test": ["b"]}))
    with pytest.raises(ValueError, match="split_tasks.json: splits 'train' and 'test' share task 'b'"):
        read_tasks(tmp_path)


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_the_installed_data_passes(domain):
    from ctu.domains import get_domain

    get_domain.cache_clear()
    try:
        assert get_domain(domain).tasks
    finally:
        get_domain.cache_clear()
