"""SIGINT and SIGTERM stop a run at its next safe point: a handler that only sets a flag (so no KeyboardInterrupt
is raised inside a weakref callback or a finally block and lost), a check between phases, exit 128 + signal, and a
second signal that kills at once."""

from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

from ctu.app.stop import Interrupted, StopSignals, exit_status

ROOT = Path(__file__).resolve().parents[3]


def test_exit_status_is_128_plus_the_signal():
    assert exit_status(signal.SIGINT) == 130 and exit_status(signal.SIGTERM) == 143


class Node:
    """Garbage with a weakref callback, as torch and asyncio make: a KeyboardInterrupt raised while the callback
    runs is printed as 'Exception ignored' and lost."""

    def __init__(self):
        self.other = self  # a cycle: freed by the collector, its callbacks run wherever it runs


def busy_step(rng: random.Random) -> None:
    deadline = time.perf_counter() + rng.uniform(0.002, 0.02)
    while time.perf_counter() < deadline:
        nodes = [Node() for _ in range(50)]
        refs = [weakref.ref(n, lambda _r: sum(range(200))) for n in nodes]
        del nodes
        gc.collect(0)
        del refs


@pytest.mark.parametrize("trial", range(20))
def test_a_signal_at_a_random_moment_always_stops_the_loop_at_a_safe_point(trial):
    rng = random.Random(trial)
    signum = rng.choice([signal.SIGINT, signal.SIGTERM])
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # another library's may be there
    steps, safe_points = 12, []
    delay = rng.uniform(0.0, 0.08)
    timer = threading.Timer(delay, os.kill, (os.getpid(), signum))
    with pytest.raises(Interrupted) as caught, StopSignals() as stops:
        timer.start()  # once the handlers are in place: a signal before them is not the loop's to catch
        for step in range(1, steps + 1):
            stops.check(f"step {step}")
            busy_step(rng)  # a phase: never cut in the middle
            safe_points.append(step)
        timer.join()  # the signal is sent while the handlers are in place, however late the timer runs
        time.sleep(0.05)
        stops.check("the end")
    assert caught.value.signum == signum and caught.value.status == exit_status(signum)
    assert len(safe_points) < steps or caught.value.where == "the end"
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers are restored after


def test_a_second_signal_stops_at_once_with_the_default_action():
    code = ("import os, signal, sys, time; from ctu.app.stop import StopSignals\n"
            "with StopSignals():\n"
            "    os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(5)\n"
            "sys.exit(7)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stderr)
    assert "stopping at the next safe point" in done.stderr


def test_outside_the_main_thread_nothing_is_installed():
    seen = []

    def worker():
        with StopSignals() as stops:
            seen.append(stops.installed)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [False]


def test_a_second_signal_kills_the_agent_processes_first(monkeypatch):
    """Agents run in sessions of their own (a signal to ctu's group misses them): the second signal, which ends ctu
    at once, kills them and what they started before the default action."""
    from ctu.app import stop
    from ctu.distributed import agent_pool

    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    monkeypatch.setitem(agent_pool.LIVE, agent.pid, agent)
    ended = []
    monkeypatch.setattr(stop.os, "kill", lambda pid, signum: ended.append(agent.poll()))  # ctu's own end, noted
    monkeypatch.setattr(stop.signal, "signal", lambda signum, handler: None)
    stops = StopSignals()
    try:
        stops._handle(signal.SIGTERM, None)
        assert agent.poll() is None  # the first signal only asks for a stop at the next safe point
        stops._handle(signal.SIGTERM, None)
        assert agent.wait(10) == -signal.SIGKILL and len(ended) == 1
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
