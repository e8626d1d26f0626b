"""Fewer threads for generation while other programs keep this machine's CPUs busy, back when they stop.

A 2-thread decode beside one busy program makes 3 runnable threads on 2 cores: every parallel region waits for its
slowest thread, which waits for the scheduler, and the step slows ~3x instead of the ~1.5-2x its share of the CPUs
would give. With one thread it runs on the core the other program leaves it.

How busy the others are is measured, not guessed: between two samples, the CPU time the kernel counted on this
process's CPUs (``/proc/stat``: user, nice, system, irq, softirq) minus this process's own CPU time (``os.times``,
all its threads), over the wall time between them, in CPUs. Niced programs count too: a stream of short nice-19
processes, each preempting a thread as it starts, slowed 2-thread steps 8x (``benchmarks/contention.py``).
Samples are taken between decode steps at most once a second; nothing is read when nothing is computed.

Generation changes its thread count in the thread that generates (torch keeps the OpenMP thread count per thread
once it has computed), the warm start and the updates before each forward pass; each only where fewer threads give
it bit for bit the same results on this CPU and model (a decode and its products at every batch size; a
micro-batch's gradients and its layers' products at token counts up to its size: checked once per run, the first
time other programs are busy, :func:`ctu.engines.cpu.cpu_threads.check`). Where they do not (a BLAS that splits a
product's sums by thread for some shapes), it keeps its threads, so that a seed's numbers do not depend on what
else runs.
``CTU_CPU_THREADS=share`` lets both share regardless.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

STAT = Path("/proc/stat")
INTERVAL_S = 1.0  # at most one sample a second
DROP_AT = 0.5  # drop a thread when the others take this much more than the CPUs this process leaves them
RAISE_AT = 0.25  # take a thread back when the others leave a whole CPU more but this much
NOTE_EVERY_S = 60.0  # a change of thread count is said at most this often


@dataclass(frozen=True)
class Sample:
    wall: float  # time.monotonic()
    busy: float  # CPU seconds the kernel counted on this process's CPUs, every process's
    own: float  # CPU seconds of this process, all its threads


def busy_seconds(stat_text: str, cpus: set[int] | None, ticks_per_s: float) -> float | None:
    """CPU seconds spent on ``cpus`` (None: every CPU) from a ``/proc/stat`` text, or None when it names none."""
    total, seen = 0, False
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        fields = [int(x) for x in rest.split()]
        if len(fields) < 7:
            continue
        user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
        total += user + nice + system + irq + softirq
        seen = True
    return total / ticks_per_s if seen else None


def others_busy(before: Sample, after: Sample) -> float:
    """CPUs other processes kept busy between two samples (0 when the interval is empty)."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


def share_threads(cap: int, current: int, others: float) -> int:
    """The thread count for generation with ``cap`` CPUs, ``current`` threads now and ``others`` CPUs busy with other
    programs. One thread fewer per CPU the others take; hysteresis so that a neighbour near a threshold does not
    switch the count at every sample."""
    cap, current = max(1, cap), min(max(1, current), max(1, cap))
    free = cap - others
    if free <= current - DROP_AT:  # the others take a CPU this process's threads would run on
        return max(1, min(current - 1, math.ceil(free - DROP_AT)))
    if free >= current + 1 - RAISE_AT:  # a CPU came free of them
        return min(cap, max(current + 1, math.floor(free + RAISE_AT)))
    return current


def sample(cpus: set[int] | None = None) -> Sample | None:
    """Now, for this process's CPUs (its affinity), or None where ``/proc/stat`` is not there (not Linux)."""
    try:
        text = STAT.read_text()
    except OSError:
        return None
    if cpus is None:
        try:
            cpus = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = None
    busy = busy_seconds(text, cpus, float(os.sysconf("SC_CLK_TCK")))
    if busy is None:
        return None
    t = os.times()
    return Sample(time.monotonic(), busy, t.user + t.system)


class Share:
    """The thread count generation should use now: sampled at most every ``INTERVAL_S``, shared by every generating
    thread of the process."""

    def __init__(self, cap: int, sampler=sample, training: bool = False) -> None:
        self.cap = max(1, cap)
        self.training = training  # the updates share too, whatever their gradients (CTU_CPU_THREADS=share)
        # what shares: "generation" and "training" (the updates), each where fewer threads gave the same bits
        self.sharing = {"generation": training, "training": training}
        self.threads = self.cap
        self.others = 0.0
        self._sampler = sampler
        self._last: Sample | None = sampler()  # from now: the first decision needs no second wait
        self._asked = time.monotonic()  # the last sampling, successful or not (no /proc/stat: not re-read per step)
        self._lock = threading.Lock()
        self._noted = -NOTE_EVERY_S
        self.changes = 0

    def _measure(self, now: float) -> bool:
        """Sample (at most every ``INTERVAL_S``); whether ``others`` was measured anew (under the lock)."""
        if now - self._asked < INTERVAL_S:
            return False
        self._asked = now
        got = self._sampler()
        if got is None:
            return False
        before, self._last = self._last, got
        if before is None:
            return False
        self.others = others_busy(before, got)
        return True

    def peek(self) -> int:
        """The count :meth:`decide` would pick now, without taking it (``threads`` unchanged, nothing to say): whether
        other programs keep the CPUs busy enough that a sharing check is due (:func:`ctu.engines.cpu.cpu_threads.due`)."""
        with self._lock:
            self._measure(time.monotonic())
            return share_threads(self.cap, self.threads, self.others)

    def decide(self) -> tuple[int, str | None]:
        """The thread count, and a line to print when it changed (at most one a minute)."""
        with self._lock:
            now = time.monotonic()
            if not self._measure(now):
                return self.threads, None
            threads = share_threads(self.cap, self.threads, self.others)
            if threads == self.threads:
                return threads, None
            self.threads, self.changes = threads, self.changes + 1
            if now - self._noted < NOTE_EVERY_S:
                return threads, None
            self._noted = now
            why = (f"other programs keep {self.others:.1f} of {self.cap} CPUs busy" if threads < self.cap
                   else "the other programs' CPUs came free")
            where, keep = "", ""
            if self.sharing["generation"] != self.sharing["training"]:
                where, keep = ((" for generation", f"; the updates keep {self.cap}") if self.sharing["generation"]
                               else (" for the updates", f"; generation keeps {self.cap}"))
            return threads, f"threads: {threads}{where} now ({why}{keep})"


_local = threading.local()


@contextlib.contextmanager
def generating():
    """While this thread generates: forwards of a model the trainer shares ask generation's share, not the updates'
    (:func:`pace_training` does nothing here)."""
    before = getattr(_local, "generating", False)
    _local.generating = True
    try:
        yield
    finally:
        _local.generating = before


def pace_training(share: Share | None, keep: bool = False, body: bool = True) -> None:
    """Before a trainer pass's products (hooks on the policy's embeddings, ``body``, and on its LM head): :func:`pace`
    with the updates' share, or the full count where ``keep`` (products of this size differ with fewer threads);
    the LM head's hook only raises the count (its backward, and the body's after it, run at the count set last).
    Nothing while this thread is generating with that model (an in-process engine), which paces itself."""
    if share is None or getattr(_local, "generating", False):
        return
    if keep:
        import torch

        if torch.get_num_threads() != share.cap:
            torch.set_num_threads(share.cap)
    elif body:
        pace(share)


def pace(share: Share | None) -> None:
    """In a generating thread, between decode steps: set this thread's torch thread count to what ``share`` says."""
    if share is None:
        return
    import torch

    threads, line = share.decide()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if line:
        print(line, flush=True)


def settle(share: Share | None) -> None:
    """When a generation ends: this thread back to the full count (torch's global count follows the last set)."""
    if share is None:
        return
    import torch

    if torch.get_num_threads() != share.cap:
        torch.set_num_threads(share.cap)
