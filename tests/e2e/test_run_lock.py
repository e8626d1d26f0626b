"""One writer per run.dir, tried with real processes: a second `ctu train` (or a resume of a live run) is refused
with one line naming the holder's pid; a lock whose holder died is taken over; exit or crash releases it."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ctu.config.runlock import LOCK_NAME, RunDirLock, RunDirLocked

ROOT = Path(__file__).resolve().parents[2]
HOLD = ("import sys; from ctu.config.runlock import RunDirLock; lock = RunDirLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); sys.stdin.read()")


SMALL = ["model.path=tiny-random", "trainer.max_steps=1", "trainer.sft_steps=0", "trainer.eval_before_train=false",
         "trainer.eval_max_tasks=1", "trainer.tasks_per_step=2", "trainer.samples_per_task=2", "sampling.max_tokens=4",
         "env.max_turns=1", "trainer.export=false"]


def env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def holder(run_dir) -> subprocess.Popen:
    """A real process that holds run_dir's lock until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT, env=env())
    assert proc.stdout.readline().strip() == "held"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize("extra", [[], ["trainer.resume=latest"]])
def test_a_second_train_on_a_live_run_dir_is_refused_naming_the_holder(tmp_path, extra):
    run_dir = tmp_path / "run"
    first = holder(run_dir)
    try:
        second = subprocess.run([sys.executable, "-m", "ctu", "train", "configs/quickstart.yaml", *SMALL,
                                 f"run.dir={run_dir}", *extra], capture_output=True, text=True, cwd=ROOT, env=env(),
                                timeout=120)
    finally:
        stop(first)
    assert second.returncode == 1
    err = second.stderr.strip()
    assert "\n" not in err and f"pid {first.pid} " in err and f"run.dir: {run_dir} is in use" in err, err
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]  # the refused run wrote nothing


def test_the_lock_is_exclusive_across_processes_and_free_after_release(tmp_path):
    first = holder(tmp_path)
    with pytest.raises(RunDirLocked, match=rf"in use by another ctu process \(pid {first.pid} on "):
        RunDirLock(tmp_path).acquire()
    stop(first)  # exits normally without calling release: the kernel drops the lock
    with RunDirLock(tmp_path) as lock:
        assert lock.held
        assert (tmp_path / LOCK_NAME).read_text().startswith(f"pid {os.getpid()} on ")
    assert (tmp_path / LOCK_NAME).read_text() == ""  # a clean release leaves no holder behind
    with RunDirLock(tmp_path) as again:
        assert again.took_over is None


def test_a_lock_whose_holder_was_killed_is_taken_over(tmp_path):
    dead = holder(tmp_path)
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=30)
    dead.stdin.close()
    with RunDirLock(tmp_path) as lock:
        assert lock.took_over is not None and lock.took_over.startswith(f"pid {dead.pid} on ")
    with RunDirLock(tmp_path), pytest.raises(RunDirLocked):  # and held exclusively again, even within one process
        RunDirLock(tmp_path).acquire()


@pytest.mark.parametrize("replace", [False, True])
def test_deleting_the_lock_file_does_not_free_a_live_run_dir(tmp_path, replace):
    first = holder(tmp_path)
    try:
        (tmp_path / LOCK_NAME).unlink()  # what a user clearing "stale" files does
        if replace:
            (tmp_path / LOCK_NAME).write_text("")
        with pytest.raises(RunDirLocked, match=rf"run\.dir: {tmp_path} is in use by another ctu process"):
            RunDirLock(tmp_path).acquire()
    finally:
        stop(first)
    with RunDirLock(tmp_path) as lock:  # free once its holder exits
        assert lock.held


def test_the_refusal_names_the_holder_while_its_lock_file_is_there(tmp_path):
    first = holder(tmp_path)
    try:
        with pytest.raises(RunDirLocked, match=rf"\(pid {first.pid} on "):
            RunDirLock(tmp_path).acquire()
        (tmp_path / LOCK_NAME).unlink()
        with pytest.raises(RunDirLocked, match=rf"\(holder unknown: its {LOCK_NAME} was removed\)"):
            RunDirLock(tmp_path).acquire()
    finally:
        stop(first)


def killed_holder(run_dir) -> int:
    dead = holder(run_dir)
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=30)
    dead.stdin.close()
    return dead.pid


def test_the_lock_code_itself_notes_a_take_over(tmp_path, capsys):
    pid = killed_holder(tmp_path)
    with RunDirLock(tmp_path):
        pass
    err = capsys.readouterr().err
    assert err == (f"ctu: note: run.dir: {tmp_path} was locked by a process that died (pid {pid} on "
                   f"{os.uname().nodename}); taken over\n"), err


@pytest.mark.parametrize("command", ["eval", "train"])
def test_every_command_that_takes_over_a_dead_holders_lock_notes_it(tmp_path, capsys, command):
    from ctu.app.cli import main

    run_dir = tmp_path / "run"
    pid = killed_holder(run_dir)
    small = ["eval.max_tasks=1", "eval.samples_per_task=1"] if command == "eval" else SMALL[1:]
    assert main([command, "model.path=tiny-random", "sampling.max_tokens=4", "env.max_turns=1", *small,
                 f"run.dir={run_dir}"]) == 0
    err = capsys.readouterr().err
    assert f"ctu: note: run.dir: {run_dir} was locked by a process that died (pid {pid} on " in err, err


def test_a_directory_that_cannot_be_flocked_falls_back_to_the_lock_file(tmp_path, monkeypatch):
    """NFS emulates flock with fcntl locks, which need a descriptor open for writing: a directory's is not."""
    import errno
    import fcntl

    real = fcntl.flock

    def no_directory_locks(fd, op):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", no_directory_locks)
    with RunDirLock(tmp_path) as lock:
        assert lock.held
        with pytest.raises(RunDirLocked, match=rf"\(pid {os.getpid()} on "):
            RunDirLock(tmp_path).acquire()
    with RunDirLock(tmp_path) as again:
        assert again.held and again.took_over is None


def test_a_run_dir_that_is_not_a_directory_is_named_in_one_line(tmp_path, capsys):
    from ctu.app.cli import main
    from ctu.config.runlock import RunDirError

    a_file = tmp_path / "file"
    a_file.write_text("x")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    to_file = tmp_path / "to_file"
    to_file.symlink_to(a_file)
    cases = {a_file: f"run.dir: {a_file} is a file, not a directory",
             dangling: f"run.dir: {dangling} is a dangling symlink to {tmp_path / 'gone'}",
             to_file: f"run.dir: {to_file} is a symlink to a file ({a_file}), not a directory",
             a_file / "run": f"run.dir: {a_file / 'run'} cannot be created: {a_file} is a file, not a directory",
             dangling / "run": f"run.dir: {dangling / 'run'} cannot be created: {dangling} is a dangling symlink to "
                               f"{tmp_path / 'gone'}"}
    for run_dir, message in cases.items():
        with pytest.raises(RunDirError) as caught:
            RunDirLock(run_dir).acquire()
        assert str(caught.value).startswith(message), (str(caught.value), message)
        assert main(["eval", "model.path=tiny-random", f"run.dir={run_dir}"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"ctu: error: {message}"), err
    assert not (tmp_path / "gone").exists() and a_file.read_text() == "x"


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path):
    from ctu.config.runlock import RunDirError

    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_NAME).symlink_to(precious)
    with pytest.raises(RunDirError, match=rf"run\.dir: {tmp_path / 'run' / LOCK_NAME} is a symlink"):
        RunDirLock(tmp_path / "run").acquire()
    assert precious.read_text() == "keep me"
    with RunDirLock(tmp_path / "run2"):  # nothing left locked
        pass
