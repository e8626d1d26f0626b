"""`ctu data import` writes every domain or none: a domain it must refuse leaves the others unwritten."""

import json

import pytest

from ctu.app.cli import main
from ctu.domains import get_domain
from ctu.episode.data.prompts import task_rows, write_prompts


def two_domains(tmp_path):
    """A parquet file of two domains' tasks, "good" (first) and "bad"."""
    mini = get_domain("mini")
    rows = []
    for name, tasks in (("good", mini.tasks[:2]), ("bad", mini.tasks[2:4])):
        for row in task_rows(mini, tasks):
            row["extra_info"]["domain"] = name
            rows.append(row)
    write_prompts(tmp_path / "p.parquet", rows)
    return tmp_path / "p.parquet"


def files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def in_the_way(out, kind):
    """Make out/bad something an import cannot write into; returns the message naming it."""
    outside = out.parent / "outside"
    if kind == "file":
        (out / "bad").write_text("x")
        return f"{out / 'bad'} is a file, not a directory"
    if kind == "dangling":
        (out / "bad").symlink_to(out.parent / "gone")
        return f"{out / 'bad'} is a dangling symlink to {out.parent / 'gone'}"
    if kind == "symlink":
        outside.mkdir()
        (out / "bad").symlink_to(outside)
        return f"domain 'bad': its folder {outside} is not directly inside --out {out}"
    (out / "bad" / "tasks.json").mkdir(parents=True)
    return f"{out / 'bad' / 'tasks.json'} is a directory"


@pytest.mark.parametrize("kind", ["file", "dangling", "symlink", "tasks_dir"])
def test_a_domain_that_cannot_be_written_leaves_every_domain_unwritten(tmp_path, capsys, kind):
    source = two_domains(tmp_path)
    out = tmp_path / "out"
    (out / "good").mkdir(parents=True)
    (out / "good" / "tasks.json").write_text("[]\n")  # an earlier import: kept as it was
    message = in_the_way(out, kind)
    before = files(tmp_path)
    assert main(["data", "import", str(source), "--out", str(out)]) == 1
    out_text, err = capsys.readouterr()
    assert err.count("\n") == 1 and message in err, err
    assert out_text == ""
    assert files(tmp_path) == before and (out / "good" / "tasks.json").read_text() == "[]\n"


def test_two_domains_import_together_and_leave_no_temporaries(tmp_path, capsys):
    source = two_domains(tmp_path)
    out = tmp_path / "a" / "out"
    assert main(["data", "import", str(source), "--out", str(out)]) == 0
    assert files(out) == ["bad", "bad/split_tasks.json", "bad/tasks.json", "good", "good/split_tasks.json",
                          "good/tasks.json"]
    mini = get_domain("mini")
    assert [t["id"] for t in json.loads((out / "bad" / "tasks.json").read_text())] == [t.id for t in mini.tasks[2:4]]
    assert capsys.readouterr().out.count("tasks ->") == 2


def test_out_that_is_a_file_is_named(tmp_path, capsys):
    source = two_domains(tmp_path)
    (tmp_path / "out").write_text("x")
    assert main(["data", "import", str(source), "--out", str(tmp_path / "out")]) == 1
    assert f"--out: {tmp_path / 'out'} is a file, not a directory" in capsys.readouterr().err
    assert (tmp_path / "out").read_text() == "x"


def test_a_failed_write_removes_what_it_staged_and_the_folders_it_made(tmp_path, capsys, monkeypatch):
    import os

    source = two_domains(tmp_path)
    out = tmp_path / "new" / "out"
    real = os.fsync
    calls = []

    def full_disk(fd):
        calls.append(fd)
        if len(calls) == 3:  # the first domain's files are staged; the second's fails
            raise OSError(28, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    assert main(["data", "import", str(source), "--out", str(out)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert files(tmp_path) == ["p.parquet"]


def test_an_import_removes_the_staging_folders_of_killed_imports_only(tmp_path, capsys):
    import os
    import subprocess
    import time

    from ctu.config.atomic import _host
    from ctu.episode.data.task_import import stage_prefix

    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    killed = out / f"{stage_prefix(dead.pid)}abcd1234"  # a kill -9 during the renames left it
    live = out / f"{stage_prefix(os.getppid())}abcd1234"  # an import running now
    old = out / ".ctu-import-k3j_x9q2"  # an older ctu's name, without the pid: removed once an hour old
    young = out / ".ctu-import-young123"
    other_host = out / f"{stage_prefix(dead.pid).replace(_host(), 'elsewhere')}abcd1234"
    mine = out / ".ctu-import-notes"  # a file of the user's, not a folder ctu made
    for folder in (killed, live, old, young, other_host):
        (folder / "mini").mkdir(parents=True)
        (folder / "mini" / "tasks.json").write_text("[]")
    mine.write_text("keep")
    an_hour_ago = time.time() - 3700
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert main(["data", "import", str(two_domains(tmp_path)), "--out", str(out)]) == 0
    left = sorted(p.name for p in out.iterdir())
    assert left == sorted(["bad", "good", live.name, young.name, other_host.name, mine.name])
