"""A run directory is never the current directory, a folder above it, a home directory or a folder of someone
else's files; ``run.overwrite`` deletes only in a folder ctu created, and only what a run writes there."""

from pathlib import Path

import pytest

from ctu.app.cli import main
from ctu.config.rundir import MARKER, RunDirError, check_run_dir, mark_run_dir, owned, place_problem
from ctu.config.runlock import RunDirLock

SMALL = ["model.path=tiny-random", "trainer.max_steps=1", "trainer.sft_steps=0", "trainer.eval_before_train=false",
         "trainer.export=false"]


def users_folder(root: Path) -> Path:
    (root / "examples").mkdir(parents=True)
    (root / "examples" / "mine.py").write_text("print('mine')\n")
    (root / "eval").mkdir()
    (root / "eval" / "my_notes.txt").write_text("notes\n")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("raw", ["", ".", "./", "..", "/", "sub/.."])
def test_the_current_directory_and_folders_above_it_are_refused(tmp_path, monkeypatch, raw):
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    problem = place_problem(raw)
    assert problem is not None and problem.startswith("run.dir: ") and "\n" not in problem
    assert ("current directory" if raw in ("", ".", "./", "sub/..") else "above the current directory") in problem
    if raw == "":
        assert "empty" in problem


def test_home_directories_are_refused_and_a_folder_of_its_own_is_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert "home directory" in place_problem(str(tmp_path / "home"))
    assert "home directory" in place_problem(str(Path.home()))
    assert place_problem("runs/a") is None and place_problem(str(tmp_path / "elsewhere")) is None


def test_a_folder_ctu_did_not_create_is_refused_and_left_alone(tmp_path):
    folder = users_folder(tmp_path / "project")
    before = snapshot(folder)
    with pytest.raises(RunDirError, match=r"run\.dir: .*project holds files ctu did not write \(eval, examples\)"):
        check_run_dir(str(folder))
    assert snapshot(folder) == before and not (folder / MARKER).exists()


def claim(raw: str) -> None:
    """What ``ctu train`` and ``ctu eval`` do: check, lock, mark."""
    check_run_dir(raw)
    with RunDirLock(raw):
        mark_run_dir(raw)


def test_a_new_or_empty_folder_is_claimed_with_a_marker(tmp_path):
    claim(str(tmp_path / "new" / "run"))
    assert owned(tmp_path / "new" / "run") and (tmp_path / "new" / "run" / MARKER).is_file()
    (tmp_path / "empty").mkdir()
    claim(str(tmp_path / "empty"))
    assert owned(tmp_path / "empty")
    claim(str(tmp_path / "empty"))  # claimed again: still fine
    assert not owned(tmp_path)
    earlier = tmp_path / "earlier"  # a run from before the marker: used, never marked
    earlier.mkdir()
    (earlier / "metrics.jsonl").write_text('{"step": 1}\n')
    claim(str(earlier))
    assert not owned(earlier)


def test_ctu_train_with_an_empty_run_dir_writes_nothing_in_the_current_directory(tmp_path, monkeypatch, capsys):
    folder = users_folder(tmp_path / "project")
    before = snapshot(folder)
    monkeypatch.chdir(folder)
    for command in ("train", "eval"):
        assert main([command, *SMALL, "run.dir=", "run.overwrite=true"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("ctu: error: run.dir: ") and "current directory" in err and err.count("\n") == 1
    assert snapshot(folder) == before and sorted(p.name for p in folder.iterdir()) == ["eval", "examples"]


def test_overwrite_refuses_a_folder_ctu_did_not_create(tmp_path, capsys):
    """A folder that holds a run and the user's own files, and no marker (written before markers, or by hand)."""
    folder = users_folder(tmp_path / "project")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    (folder / ".ctu.lock").write_text("")
    before = snapshot(folder)
    assert main(["train", *SMALL, f"run.dir={folder}", "run.overwrite=true"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ctu: error: run.dir: {folder} was not created by ctu") and err.count("\n") == 1, err
    assert snapshot(folder) == before
