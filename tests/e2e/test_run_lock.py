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
