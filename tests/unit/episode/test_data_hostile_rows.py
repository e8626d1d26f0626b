"""`ctu data import` of hostile parquet rows: each refusal is one line naming the file and the row (an int domain, a
list split, a ground truth nested 100k deep), and a small file that decodes to much more is read a few rows at a
time, never whole."""

from __future__ import annotations

import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctu.app.cli import main
from ctu.domains import get_domain
from ctu.episode.data.prompts import read_prompts, task_rows, task_to_tau2

MINI = get_domain("mini")


def rows(n=2):
    return task_rows(MINI, MINI.tasks[:n])


def write(path, table_rows):
    pq.write_table(pa.Table.from_pylist(table_rows), path)
    return path


@pytest.mark.parametrize("change, message", [
    (lambda r: r["extra_info"].update(domain=5), "row 1: extra_info.domain is int (5), not a domain name"),
    (lambda r: r["extra_info"].update(split=["train", "test"]), "row 1: extra_info.split is list"),
    (lambda r: r["reward_model"].update(ground_truth="[" * 100_000 + "]" * 100_000),
     "row 1: ground_truth is nested too deeply"),
    (lambda r: r["reward_model"].update(ground_truth='{"id": "x", "a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
     "row 1: ground_truth is nested too deeply"),
])
def test_a_hostile_row_is_one_line_naming_the_file_and_row(tmp_path, capsys, change, message):
    table = rows()
    for row in table:
        row.pop("reward_spec")  # the verl column only: the changed ground truth is the one read
    for row in table:
        row["extra_info"]["split"] = "train"
    change(table[1])
    if isinstance(table[1]["extra_info"]["domain"], int):  # one column, one type: every row's domain an int
        table[0]["extra_info"]["domain"] = 4
        message = message.replace("row 1", "row 0").replace("(5)", "(4)")
    if isinstance(table[1]["extra_info"]["split"], list):
        table[0]["extra_info"]["split"] = ["train"]
        message = message.replace("row 1", "row 0")
    path = write(tmp_path / "p.parquet", table)
    assert main(["data", "import", str(path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err == f"ctu: error: {path}: {message}" + err.split(message, 1)[1], err[:500]
    assert len(err.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_file_with_no_task_column_is_refused_before_any_row(tmp_path):
    path = write(tmp_path / "p.parquet", [{"prompt": "x"}])
    with pytest.raises(Exception, match=r"p.parquet: no reward_spec or reward_model column"):
        read_prompts(path)


def test_a_small_file_that_decodes_large_is_read_a_few_rows_at_a_time(tmp_path):
    """96 rows sharing one 0.5 MB ground truth: a dictionary-encoded file of a few KB that decodes to 48 MB. Row 1
    repeats row 0's task: refused there, with one batch decoded (the whole table was decoded first)."""
    task = dict(task_to_tau2(MINI.tasks[0]), description={"notes": "x" * (1 << 19)})
    truth = json.dumps(task)
    table = [{"reward_model": {"ground_truth": truth}, "extra_info": {"domain": "mini"}} for _ in range(96)]
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(table), path, compression="zstd")
    assert path.stat().st_size < 200_000
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    tracemalloc.start()
    try:
        with pytest.raises(Exception, match=r"p.parquet: row 1: task '.*' of domain 'mini' appears twice"):
            read_prompts(path)
        python_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(previous)
    assert pool.max_memory() < 24 << 20, pool.max_memory() >> 20
    assert python_peak < 24 << 20, python_peak >> 20
