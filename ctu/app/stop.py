"""Ctrl-C (SIGINT) and SIGTERM stop a run at its next safe point, never in the middle of a phase.

Python's own SIGINT handler raises ``KeyboardInterrupt`` wherever the main thread happens to be, a weakref callback or
a ``finally`` block included, where it is printed as "Exception ignored" and lost: the run went on. Inside
:class:`StopSignals` the handler only records the signal; the loop calls :meth:`StopSignals.check` between phases
(before a step, before an evaluation, between a step's rollouts and its update), which raises :class:`Interrupted`.
The command exits with :func:`exit_status` (130 for SIGINT, 143 for SIGTERM). A second signal restores the default
action and delivers it again: the process stops at once.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signum: int) -> int:
    """A command stopped by signal ``signum`` exits 128 + signum, as a shell reports it."""
    return 128 + int(signum)


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal at a safe point: ``signum``, ``where`` (the point), ``status`` (the exit status)."""

    def __init__(self, signum: int, where: str, detail: str = ""):
        self.signum, self.where, self.status = int(signum), where, exit_status(signum)
        name = signal.Signals(self.signum).name
        super().__init__(f"{name} received; stopped {where}" + (f"; {detail}" if detail else ""))


class StopSignals:
    """``with StopSignals() as stops: ... stops.check("before step 3")``. Installs its handlers only in the main
    thread (``installed``) and puts the previous ones back on exit."""

    def __init__(self):
        self.received: int | None = None
        self.installed = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            self.installed = True
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        self.installed = False

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:  # the second: the default action, now
            from ctu.distributed.agent_pool import kill_live_agents

            kill_live_agents()  # agents run in sessions of their own: the signal's default action would miss them
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        # os.write, not print: a handler that prints while the stream is mid-write raises "reentrant call"
        os.write(2, f"\nctu: {signal.Signals(signum).name} received: stopping at the next safe point "
                    "(send it again to stop at once)\n".encode())

    def check(self, where: str, detail: str = "") -> None:
        """Raise :class:`Interrupted` if a signal came: the run stops here (``where``: "before step 3")."""
        if self.received is not None:
            raise Interrupted(self.received, where, detail)
