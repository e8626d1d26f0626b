"""Tasks out as the parquet prompt layout verl and SkyRL read, and back in as tau2 tasks ctu trains on."""

import builtins
import json

import pytest

from ctu.config.schema import ConfigError, load_config
from ctu.domains import get_domain
from ctu.domains.base import Action, Task
from ctu.episode.data.conversations import DataError
from ctu.episode.data.prompts import load_tasks, read_prompts, task_rows, task_to_tau2, write_prompts, write_tasks
from ctu.episode.env import system_prompt
from ctu.rollout.components import build_domains


def test_parquet_columns_are_the_ones_verl_and_skyrl_read(tmp_path):
    import pyarrow.parquet as pq

    mini = get_domain("mini")
    write_prompts(tmp_path / "mini.parquet", task_rows(mini, mini.split("all")))
    table = pq.read_table(tmp_path / "mini.parquet")
    assert table.column_names == ["data_source", "prompt", "env_class", "ability", "reward_spec", "reward_model",
                                  "extra_info"]
    row = table.slice(7, 1).to_pylist()[0]
    task = mini.tasks[7]
    assert row["prompt"] == [{"role": "system", "content": system_prompt(mini)},
                             {"role": "assistant", "content": "Hi! How can I help you today?"},
                             {"role": "user", "content": task.user_scenario["script"][0]}]
    assert row["env_class"] == "ctu_mini" and row["data_source"] == "ctu/mini"
    assert row["reward_spec"]["method"] == "rule" and row["reward_model"]["style"] == "rule"
    assert json.loads(row["reward_spec"]["ground_truth"]) == task_to_tau2(task)
    assert row["extra_info"] == {"domain": "mini", "task_id": task.id, "index": 7,
                                 "split": "test" if task.id in mini.splits["test"] else "train"}


@pytest.mark.parametrize("name", ["mini", "retail", "airline"])
def test_export_then_import_gives_equal_tasks_and_splits(tmp_path, name):
    domain = get_domain(name)
    tasks = domain.split("all") if name == "mini" else domain.split("train")[:20] + domain.split("test")[:5]
    write_prompts(tmp_path / "p.parquet", task_rows(domain, tasks))
    back = read_prompts(tmp_path / "p.parquet")
    assert list(back) == [name] and back[name]["tasks"] == tasks
    for split, ids in back[name]["splits"].items():
        assert set(ids) <= set(domain.splits[split])
    path = write_tasks(tmp_path / name, back[name]["tasks"], back[name]["splits"])
    loaded, splits = load_tasks(path)
    assert list(loaded) == tasks and {k: list(v) for k, v in splits.items()} == back[name]["splits"]


def test_unusual_tasks_survive_the_round_trip():
    no_criteria = Task.from_tau2({"id": "a", "user_scenario": {"instructions": "x"}, "evaluation_criteria": None})
    db_unchecked = Task.from_tau2({"id": "b", "user_scenario": {}, "evaluation_criteria": {
        "actions": None, "communicate_info": ["42"], "reward_basis": ["COMMUNICATE"]}})
    empty_actions = Task("c", {}, actions=(), reward_basis=("DB", "ACTION"))
    compare = Task("d", {}, actions=(Action("f", {"x": 1, "y": 2}, "user", "d-0", ("x",)),),
                   nl_assertions=("said hi",), description={"purpose": "p"})
    restricted = Task("e", {}, user_tools=("apply_for_credit_card",))  # banking_knowledge: the user's own tools
    no_user_tools = Task("f", {}, user_tools=())
    for task in (no_criteria, db_unchecked, empty_actions, compare, restricted, no_user_tools):
        assert Task.from_tau2(json.loads(json.dumps(task_to_tau2(task)))) == task
    assert not db_unchecked.checks_db and empty_actions.checks_db and not no_criteria.has_criteria


def write_rows(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def test_a_bad_prompt_dataset_is_one_line_naming_the_file_and_row(tmp_path):
    mini = get_domain("mini")
    good = task_rows(mini, mini.tasks[:2])
    cases = [
        ({**good[1], "reward_spec": {"method": "rule", "ground_truth": "{not json"}}, "ground_truth is not JSON"),
        ({**good[1], "reward_spec": {"method": "rule", "ground_truth": "[1]"}}, "not a tau2 task"),
        ({**good[1], "reward_spec": {"method": "rule", "ground_truth": None},
          "reward_model": {"style": "rule", "ground_truth": None}}, "no reward_spec.ground_truth"),
        (good[0], "task 'mini-0000' of domain 'mini' appears twice"),
    ]
    for bad, message in cases:
        path = tmp_path / "bad.parquet"
        write_rows(path, [good[0], bad])
        with pytest.raises(DataError, match=message) as info:
            read_prompts(path)
        assert str(info.value).startswith(f"{path}: row 1: ")
    (tmp_path / "text.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"text\.parquet: not a parquet file"):
        read_prompts(tmp_path / "text.parquet")


def test_verl_style_rows_with_an_object_ground_truth_are_read(tmp_path):
    mini = get_domain("mini")
    task = mini.tasks[3]
    row = {"data_source": "ctu/mini", "prompt": [{"role": "user", "content": "hi"}],
           "reward_model": {"style": "rule", "ground_truth": json.dumps(task_to_tau2(task))}, "extra_info": {"index": 0}}
    write_rows(tmp_path / "verl.parquet", [row])
    assert read_prompts(tmp_path / "verl.parquet") == {"mini": {"tasks": [task], "splits": {}}}


def test_without_pyarrow_the_error_names_the_extra(tmp_path, monkeypatch):
    real = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(DataError, match=r"pip install 'ctu\[data\]'"):
        write_prompts(tmp_path / "x.parquet", [])


def test_env_tasks_replaces_a_domains_tasks_and_splits(tmp_path):
    mini = get_domain("mini")
    chosen = [mini.tasks[0], mini.tasks[5], mini.tasks[9]]
    path = write_tasks(tmp_path / "mini", chosen, {"train": [chosen[0].id, chosen[1].id], "test": [chosen[2].id]})
    (domain,) = build_domains(load_config(None, [f"env.tasks.mini={path}"]))
    assert list(domain.tasks) == chosen and domain.split("test") == [chosen[2]]
    assert domain.db is get_domain("mini", None).db and domain.tools == mini.tools  # the rest is unchanged
    with pytest.raises(ConfigError, match=r"env\.tasks\.mini: tasks file .* does not exist"):
        load_config(None, [f"env.tasks.mini={tmp_path / 'nope.json'}"])
    with pytest.raises(ConfigError, match=r"env\.tasks\.retail: not one of env\.domains"):
        load_config(None, [f"env.tasks.retail={path}"])
    (tmp_path / "split_tasks.json").write_text(json.dumps({"test": ["zzz"]}))
    bad = write_tasks(tmp_path, chosen, {"test": ["zzz"]})
    with pytest.raises(ValueError, match="split 'test' names task 'zzz'"):
        build_domains(load_config(None, [f"env.tasks.mini={bad}"]))


@pytest.mark.parametrize("tasks,splits,where,message", [
    ("[\n" + "[" * 100_000 + "]" * 100_000 + "\n]", None, "tasks.json:2", "nested too deeply"),
    ('[\n{"id": "a",\n oops}]', None, "tasks.json:3", "not valid JSON"),
    (None, "{oops", "split_tasks.json:1", "not valid JSON"),
    (None, "[1, 2]", "split_tasks.json", "expected a JSON object of split names"),
    (None, '{"test": "t1"}', "split_tasks.json", "split 'test' is not a list of task ids"),
    (None, '{"a": ' * 100_000 + "1" + "}" * 100_000, "split_tasks.json:1", "nested too deeply"),
])
def test_a_bad_tasks_or_splits_file_is_one_error_naming_the_file(tmp_path, tasks, splits, where, message):
    mini = get_domain("mini")
    path = write_tasks(tmp_path, mini.tasks[:2], {})
    if tasks is not None:
        path.write_text(tasks)
    if splits is not None:
        (tmp_path / "split_tasks.json").write_text(splits)
    with pytest.raises(DataError, match=message) as info:
        load_tasks(path)
    assert str(info.value).startswith(f"{tmp_path}/{where}") and "\n" not in str(info.value)


def hostile_rows(domain_name, data_source=None):
    mini = get_domain("mini")
    rows = task_rows(mini, mini.split("all")[:3])
    for row in rows:
        row["extra_info"]["domain"] = domain_name
        if data_source is not None:
            row["data_source"] = data_source
    return rows


@pytest.mark.parametrize("name,source", [("../../escape", None), ("{tmp}/abs", None), ("a/b", None), ("..", None),
                                         ("", "ctu/../../escape"), ("", "ctu/.")])
def test_an_import_never_writes_outside_out(tmp_path, capsys, name, source):
    from ctu.app.cli import main

    write_prompts(tmp_path / "p.parquet", hostile_rows(name.format(tmp=tmp_path), source))
    out = tmp_path / "a" / "b" / "out"
    assert main(["data", "import", str(tmp_path / "p.parquet"), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "row 0: domain" in err and "is not a domain name" in err, err
    assert [p.name for p in tmp_path.rglob("*")] == ["p.parquet"]  # nothing written anywhere


def test_importing_again_replaces_the_splits_of_the_first_import(tmp_path, capsys):
    from ctu.app.cli import main

    mini = get_domain("mini")
    write_prompts(tmp_path / "split.parquet", task_rows(mini, mini.split("all")))
    rows = task_rows(mini, mini.split("all")[:4])
    for row in rows:
        row["extra_info"]["split"] = ""  # a dataset without splits
    write_prompts(tmp_path / "plain.parquet", rows)
    out = tmp_path / "out"
    assert main(["data", "import", str(tmp_path / "split.parquet"), "--out", str(out)]) == 0
    assert (out / "mini" / "split_tasks.json").is_file()
    assert main(["data", "import", str(tmp_path / "plain.parquet"), "--out", str(out)]) == 0
    assert not (out / "mini" / "split_tasks.json").exists()  # a stale one would name tasks no longer there
    (domain,) = build_domains(load_config(None, [f"env.tasks.mini={out / 'mini' / 'tasks.json'}"]))
    assert list(domain.tasks) == mini.split("all")[:4] and domain.split("all") == mini.split("all")[:4]
    assert sorted(p.name for p in (out / "mini").iterdir()) == ["tasks.json"]  # no temporaries left
