"""How many threads the CPU tier computes with, and how its OpenMP threads wait: chosen so that a run on a shared
machine slows in proportion to the CPU it loses.

torch's CPU build parallelizes with GNU OpenMP (libgomp), whose threads spin between parallel regions for
``GOMP_SPINCOUNT`` iterations (300,000 by default: ~10-15 ms of ``pause`` instructions) before sleeping. On a quiet
machine the spinning saves a wake-up; beside another busy process the spinning threads take the cores the threads
doing the work wait for, and a 2-core run beside one busy loop slowed 3-60x instead of the fair ~1.5-2x
(``benchmarks/contention.py``). A short spin count keeps the quiet speed of spinning through the short gaps of a
decode step and sleeps through the long ones. libgomp reads its settings once, when torch loads: ``ctu``'s
entry point calls :func:`apply` before anything imports torch.

The thread count is the CPUs this process may run on (its affinity mask) capped by its cgroup's CPU quota
(``cpu.max``); :func:`refresh` re-reads both between phases of a run (a container resized, a ``taskset`` moved
it). A setting the user made (``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``, ``KMP_BLOCKTIME``) is kept
and named in the one line the run prints; ``CTU_CPU_THREADS=off`` leaves OpenMP and torch as they were,
``CTU_CPU_THREADS=fixed`` keeps the count when other programs are busy (generation otherwise takes fewer threads
then: :mod:`ctu.engines.cpu.cpu_share`, and so do the warm start and the updates where :func:`check` finds
their gradients the same with fewer threads, as generation does its decode's tokens and logprobs); ``CTU_CPU_THREADS=share`` lets them take fewer regardless.

This module imports no torch at load (``apply`` runs before torch is imported).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctu.engines.cpu.cpu_share import Share

# libgomp spin iterations before a waiting thread sleeps (its default: 300,000). Measured on a quiet 2-core Sapphire
# Rapids, the quickstart's decode step (docs/cpu.md): 1,000 cost 30% alone (the gaps between a step's parallel
# regions outlast it: every region pays a wake-up), 10,000 15%, 30,000 nothing; beside a busy loop they gave 1.8x,
# 2.1x and 3.0x the quiet step against 9.6x with the default. Quiet speed comes first: 30,000.
SPIN_COUNT = 30000
# Intel OpenMP (libiomp, some torch builds): how long a waiting thread spins, in ms (its default is 200)
BLOCK_TIME_MS = 1
USER_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
OFF_VAR = "CTU_CPU_THREADS"
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Choice:
    threads: int  # the intra-op thread count
    env: dict[str, str] = field(default_factory=dict)  # variables to set before torch loads
    message: str = ""  # the one line a run prints
    set_threads: bool = True  # whether to set torch's thread count (False: the user's OMP_NUM_THREADS or off)
    share: bool = False  # generation takes fewer threads while other programs keep the CPUs busy (cpu_share)
    share_training: bool = False  # and so do the warm start and the updates (CTU_CPU_THREADS=share)


def choose(affinity: int, quota: float | None, env: Mapping[str, str]) -> Choice:
    """The threads and OpenMP waits for a process that may run on ``affinity`` CPUs under a cgroup quota of
    ``quota`` CPUs (None: no quota), given the environment ``env``. Pure: nothing is read or set."""
    affinity = max(1, affinity)
    mode = env.get(OFF_VAR, "").strip().lower()
    if mode in ("0", "off", "false", "no"):
        return Choice(affinity, {}, f"threads: torch's default, OpenMP waits as they are ({OFF_VAR}=off)", False)
    cap = affinity if quota is None else max(1, min(affinity, math.ceil(quota - 1e-9)))
    where = f"affinity {affinity}, cgroup quota {'none' if quota is None else f'{quota:g} CPUs'}"
    user_threads = env.get("OMP_NUM_THREADS", "").strip()
    if user_threads:
        first = user_threads.split(",")[0]
        threads = int(first) if first.isdigit() and int(first) > 0 else cap
        thread_part = f"threads: {user_threads} (OMP_NUM_THREADS kept from the environment; {where})"
        set_threads = share = share_training = False
    else:
        threads = cap
        set_threads = True
        share = mode != "fixed" and (quota is None or quota >= affinity)  # under a binding quota it is the share
        share_training = share and mode == "share"
        fewer = "; fewer while other programs are busy" if share_training else (
            "; fewer while other programs are busy, for generation and for the updates each where fewer give the"
            " same bits (checked when other programs first are)" if share else "")
        thread_part = f"threads: {threads} ({where}{fewer})"
    kept = [f"{name}={env[name]}" for name in USER_WAIT_VARS if env.get(name, "").strip()]
    if kept:
        wait_part = f"OpenMP waits: {', '.join(kept)} kept from the environment"
        to_set: dict[str, str] = {}
    else:
        to_set = {"GOMP_SPINCOUNT": str(SPIN_COUNT), "KMP_BLOCKTIME": str(BLOCK_TIME_MS)}
        wait_part = f"OpenMP waits: spin {SPIN_COUNT} then sleep (GOMP_SPINCOUNT={SPIN_COUNT}: a shared CPU is not spun on)"
    return Choice(threads, to_set, f"{thread_part}, {wait_part}", set_threads, share, share_training)


def affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cgroup_quota(root: Path = CGROUP_ROOT) -> float | None:
    """This process's cgroup CPU quota in CPUs (cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us``), None if none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    own = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "/")
    candidates = [root / own.lstrip("/") / "cpu.max", root / "cpu.max"]
    for path in candidates:
        try:
            limit, period = path.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if limit == "max" else int(limit) / int(period)
    try:
        v1_quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        v1_period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if v1_quota <= 0 else v1_quota / v1_period


_applied: Choice | None = None
_share: Share | None = None
_late = False  # torch was loaded before apply: its OpenMP waits could not be set
_announced = False
_invariant: dict[str, bool] = {}  # kind -> fewer threads give the same results (missing: not checked yet)
# kind -> where ("body", "head") -> token-count ranges [lo, hi) whose products differ with fewer threads: passes with
# such a product keep their threads while the kind shares otherwise
_differ_at: dict[str, dict[str, list[tuple[int, int]]]] = {}


def apply(environ: MutableMapping[str, str] | None = None) -> Choice:
    """Choose and set the OpenMP variables (before torch loads, or they do nothing: the line :func:`note` gives then
    says so) and, where torch is loaded, its thread count."""
    global _applied, _late, _share, _invariant
    environ = os.environ if environ is None else environ
    choice = choose(affinity_cpus(), cgroup_quota(), environ)
    _late = "torch" in sys.modules and bool(choice.env)
    for name, value in choice.env.items():
        environ.setdefault(name, value)
    if choice.set_threads and "torch" in sys.modules:
        import torch

        torch.set_num_threads(choice.threads)
    elif choice.set_threads and choice.threads != affinity_cpus():  # OpenMP counts the affinity, not the quota
        environ.setdefault("OMP_NUM_THREADS", str(choice.threads))
    _applied = choice
    _share = Share(choice.threads, training=choice.share_training) if choice.share else None
    _invariant = {}
    _differ_at.clear()
    return choice


def own_threads() -> None:
    """In a thread about to compute: torch's thread count at this run's full count, where ctu sets it. A thread
    takes the count torch was last given, in any thread, when it first computes: after an update that shared the
    CPUs it would be 1, so generation that must keep its threads (:func:`check`) sets its own."""
    if _applied is None or not _applied.set_threads:
        return
    import torch

    full = _share.cap if _share is not None else _applied.threads
    if torch.get_num_threads() != full:
        torch.set_num_threads(full)


def generation_share() -> Share | None:
    """What generation asks, between decode steps, for its thread count: the share where fewer threads give a
    decode the same tokens and logprobs (:func:`check`) or where the user let it share anyway; None, and the count is fixed,
    otherwise."""
    return _shared("generation")


def training_share() -> Share | None:
    """What the warm start and the updates ask before each forward pass: the share where fewer threads give the same
    gradients (:func:`check`) or where the user let them share anyway (``CTU_CPU_THREADS=share``: a seed's numbers
    may then depend on what else runs); None, and they keep their threads, otherwise."""
    return _shared("training")


def _shared(kind: str) -> Share | None:
    if _share is None:
        return None
    return _share if _share.training or _invariant.get(kind) else None


def due(kind: str) -> bool:
    """Whether :func:`check` should run for ``kind`` now: not run yet, and other programs keep this process's CPUs
    busy enough that sharing would take a thread. Until then ``kind`` keeps its threads, as it would where the check
    failed; on a quiet machine it never runs (each pass at every count sharing could pick: 19 s of the quickstart's
    13.5 minutes on a 2-core Zen 4, and the training probe's activations on top of the run's peak memory)."""
    return not checked(kind) and _share is not None and _share.peek() < _share.cap


def checked(kind: str) -> bool:
    """Whether :func:`check` has nothing (more) to check for ``kind`` in this process."""
    return kind in _invariant or _share is None or _share.training or _share.cap < 2


WHAT = {"generation": ("generation", "a decode's tokens and logprobs, its products at every batch size"),
        "training": ("the updates", "a micro-batch's gradients, its layers' products at token counts to its size")}


def _counts(ns: Sequence[int]) -> str:
    return f"{', '.join(map(str, ns))} thread{'s' if list(ns) != [1] else ''}"


def check(kind: str, compute: Callable[[], Sequence[Any]]) -> str | None:
    """Once per process and ``kind`` ("generation" or "training"), before its first pass: whether fewer threads, as
    sharing would run it, give bit for bit the same results. ``compute`` returns tensors (logits, gradients) computed
    at the calling thread's torch thread count; it runs at the full count and at each count sharing could pick.
    Where they agree, ``kind`` shares the CPUs while other programs are busy and a seed's numbers still do not depend
    on what else runs; where not (a CPU's kernels that sum in another order with fewer threads), it keeps its
    threads. Returns the line to print (None: nothing was checked)."""
    if checked(kind):
        return None
    assert _share is not None
    import torch

    started = time.perf_counter()
    before = torch.get_num_threads()
    counts = sorted({1, 2, _share.cap // 2, _share.cap - 1} & set(range(1, _share.cap)))
    labels = getattr(compute, "labels", None)  # per tensor: None (the whole pass) or (where, token count)
    differ: list[int] = []
    sized: set[tuple[str, int]] = set()
    try:
        torch.set_num_threads(_share.cap)
        full = [t.detach().clone() for t in compute()]
        drifted = torch.get_num_threads() != _share.cap
        for n in counts:
            torch.set_num_threads(n)
            got = compute()
            # a pass that changed its own thread count (pacing between decode steps) compared other counts than
            # these: it vouches for nothing, so the kind keeps its threads
            bad = ({None} if drifted or torch.get_num_threads() != n or len(got) != len(full) else
                   {labels[i] if labels else None for i, (a, b) in enumerate(zip(full, got, strict=True))
                    if not torch.equal(a, b)})
            if None in bad:
                differ.append(n)
            sized |= {b for b in bad if b is not None}
    finally:
        torch.set_num_threads(before)
    _invariant[kind] = _share.sharing[kind] = not differ
    _differ_at[kind] = differing_ranges(sized, labels or [])
    who, what = WHAT[kind]
    took = f"; checked in {time.perf_counter() - started:.1f} s"
    if not differ:
        verb = "shares" if kind == "generation" else "share"
        but = "; ".join(f"{where} products of {_spans(r)} tokens differ, passes with them keep {_share.cap}"
                        for where, r in _differ_at[kind].items())
        return (f"threads: {who} {verb} the CPUs while other programs are busy ({what} on {_counts(counts)} and "
                f"{_share.cap}: the same bits{'; except: ' + but if but else ''}{took})")
    keep = "keeps" if kind == "generation" else "keep"
    return (f"threads: {who} {keep} {_share.cap} ({what} on {_counts(differ)} differ from {_share.cap}'s in the last "
            f"bits on this CPU: a seed's numbers would depend on what else runs; {OFF_VAR}=share to share anyway{took})")


def _spans(ranges: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"{lo}-{hi - 1}" if hi - lo > 1 else str(lo) for lo, hi in ranges)


def differing_ranges(sized: set, labels: Sequence) -> dict[str, list[tuple[int, int]]]:
    """For each place ("body", "head"), the token-count ranges [lo, hi) that may differ: each differing count probed
    and every count between it and its nearest probed counts that agreed (the probe samples larger counts)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for where in sorted({w for w, _ in sized}):
        agree = {label[1] for label in labels if label and label[0] == where} - {n for w, n in sized if w == where}
        for n in sorted(n for w, n in sized if w == where):
            lo = max((a + 1 for a in agree if a < n), default=1)
            hi = min((a for a in agree if a > n), default=1 << 62)
            ranges = out.setdefault(where, [])
            if ranges and ranges[-1][1] >= lo:
                ranges[-1] = (ranges[-1][0], max(ranges[-1][1], hi))
            else:
                ranges.append((lo, hi))
    return out


def keeps(kind: str, where: str, tokens: int) -> bool:
    """Whether a pass of ``kind`` whose ``where`` products ("body": the decoder's, "head": the LM head's) run on
    ``tokens`` rows must keep its threads though the kind shares (:func:`check` found such products differ)."""
    return any(lo <= tokens < hi for lo, hi in _differ_at.get(kind, {}).get(where, ()))


def note() -> str | None:
    """The choice, as one line, the first time it is asked for (None after, or when :func:`apply` never ran)."""
    global _announced
    if _applied is None or _announced:
        return None
    _announced = True
    return _applied.message + (" (torch loaded first: its OpenMP waits are as they were)" if _late else "")


def refresh() -> int | None:
    """Between phases: re-read the affinity and quota and set torch's thread count when it should change (and the
    user did not fix it). Returns the new count when it changed."""
    global _applied, _invariant
    if _applied is None or not _applied.set_threads:
        return None
    import torch

    threads = choose(affinity_cpus(), cgroup_quota(), {}).threads
    if threads == _applied.threads:  # (not torch's count: sharing may have lowered it for a while)
        return None
    _applied = dataclasses.replace(_applied, threads=threads)
    torch.set_num_threads(threads)
    _invariant = {}  # other counts now: checked again before the next pass
    _differ_at.clear()
    if _share is not None:
        _share.cap = _share.threads = threads
        _share.sharing = dict.fromkeys(_share.sharing, _share.training)
    print(f"threads: {threads} now (the CPUs this process may use changed)", flush=True)
    return threads
