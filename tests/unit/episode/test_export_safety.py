"""Exports never make things worse: a broken dataset_info.json, a symlinked --out, or nothing to export is one line
naming the file, with the target untouched; a replaced file keeps its mode (a new one follows the umask); a writer
killed with SIGKILL leaves a temporary that the next write in that folder removes; errors name --out."""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ctu.app.cli import main
from ctu.config import atomic

PREVIOUS = b'{"previous": "export"}\n'


def export(out, *extra, fmt="sharegpt"):
    return main(["data", "export", "--domain", "mini", "--split", "test", "--format", fmt, "--out", str(out), *extra])


def error_line(capsys) -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    return err[0]


def folder(path):
    return {p.name: p.read_bytes() for p in path.iterdir()}


@pytest.mark.parametrize("info,why", [
    ("{oops", "dataset_info.json:1: not valid JSON"),
    ("[1, 2]", "dataset_info.json: expected a JSON object of LLaMA-Factory datasets, got list"),
    ('{"a": 1,\n "b": [' + "[" * 100_000 + "]" * 100_000 + "]}", "dataset_info.json:1: nested too deeply"),
])
def test_a_broken_dataset_info_is_named_before_the_target_is_touched(tmp_path, capsys, info, why):
    (tmp_path / "t.jsonl").write_bytes(PREVIOUS)
    (tmp_path / "dataset_info.json").write_text(info)
    before = folder(tmp_path)
    assert export(tmp_path / "t.jsonl") == 1
    assert error_line(capsys).startswith(f"ctu: error: {tmp_path / why}")
    assert folder(tmp_path) == before


def test_a_replaced_file_keeps_its_mode_and_a_new_one_follows_the_umask(tmp_path):
    (tmp_path / "t.jsonl").write_bytes(PREVIOUS)
    (tmp_path / "dataset_info.json").write_text("{}")
    os.chmod(tmp_path / "t.jsonl", 0o600)
    os.chmod(tmp_path / "dataset_info.json", 0o640)
    old = os.umask(0o027)
    try:
        assert export(tmp_path / "t.jsonl") == 0
        assert export(tmp_path / "new" / "n.jsonl") == 0
    finally:
        os.umask(old)
    mode = {p: stat.S_IMODE((tmp_path / p).stat().st_mode) for p in
            ("t.jsonl", "dataset_info.json", "new/n.jsonl", "new/dataset_info.json")}
    assert mode == {"t.jsonl": 0o600, "dataset_info.json": 0o640, "new/n.jsonl": 0o640,
                    "new/dataset_info.json": 0o640}
    assert (tmp_path / "t.jsonl").read_bytes() != PREVIOUS


@pytest.mark.parametrize("link", ["t.jsonl", "dataset_info.json"])
def test_a_symlink_is_refused_in_one_line_and_nothing_is_touched(tmp_path, capsys, link):
    (tmp_path / "real").write_bytes(PREVIOUS)
    (tmp_path / link).symlink_to(tmp_path / "real")
    assert export(tmp_path / "t.jsonl") == 1
    assert error_line(capsys) == (f"ctu: error: {tmp_path / link}: is a symbolic link; ctu replaces regular files only "
                                  "(remove the link, or write to the file it points to)")
    assert (tmp_path / link).is_symlink() and (tmp_path / "real").read_bytes() == PREVIOUS
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"real", link})


def trajectories(run, rewards):
    run.mkdir()
    rows = [{"domain": "mini", "task_id": "t", "reward": r, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]} for r in rewards]
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_an_empty_export_is_refused_unless_asked_and_the_target_kept(tmp_path, capsys):
    trajectories(tmp_path / "run", [0.0, 0.5])
    out = tmp_path / "t.jsonl"
    out.write_bytes(PREVIOUS)
    args = ["data", "export", "--trajectories", str(tmp_path / "run"), "--format", "openai", "--out", str(out)]
    assert main(args) == 1
    assert error_line(capsys) == (f"ctu: error: nothing to export: 0 of 2 episodes (reward >= 1.0) of "
                                  f"{tmp_path / 'run'}; {out} is left as it was (--allow-empty writes an empty file)")
    assert out.read_bytes() == PREVIOUS
    assert main([*args, "--allow-empty"]) == 0
    assert out.read_bytes() == b""


def test_errors_name_out_not_the_temporary(tmp_path, capsys, monkeypatch):
    (tmp_path / "d.jsonl").mkdir()
    assert export(tmp_path / "d.jsonl", fmt="openai") == 1
    assert error_line(capsys) == f"ctu: error: {tmp_path / 'd.jsonl'}: is a directory; ctu replaces regular files only"

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    assert export(tmp_path / "t.jsonl", fmt="openai") == 1
    assert error_line(capsys) == f"ctu: error: {tmp_path / 't.jsonl'}: No space left on device"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]


WRITER = textwrap.dedent("""
    import sys, time
    from ctu.config.atomic import atomic_open
    with atomic_open(sys.argv[1]) as f:
        f.write("half an export")
        f.flush()
        print("writing", flush=True)
        time.sleep(120)
""")


def writer(target):
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(Path(atomic.__file__).parents[2])})
    assert process.stdout.readline() == "writing\n"
    return process


def test_the_temporary_of_a_killed_writer_is_removed_by_the_next_write_in_its_folder(tmp_path):
    killed, alive = writer(tmp_path / "t.jsonl"), writer(tmp_path / "other.jsonl")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        temps = sorted(p.name for p in tmp_path.iterdir())
        assert len(temps) == 2 and all(".ctu-tmp." in t for t in temps)
        assert export(tmp_path / "t.jsonl", fmt="openai") == 0
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(["t.jsonl", next(t for t in temps if t.startswith(".other.jsonl."))])
    finally:
        alive.kill()
        alive.wait()
