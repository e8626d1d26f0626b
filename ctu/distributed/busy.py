"""Busy time of work that may overlap (groups a rollout worker or an agent program plays at once): the union of the
intervals in which at least one piece ran. Summing their wall times counts shared time once per piece, so an
engine playing two groups together for a second looked busy for two."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager


class BusyClock:
    """``begin()`` / ``end(token)`` around each piece of work, from any thread; ``seconds()``: the time so far in
    which at least one piece ran (the one running now included)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._lock = threading.Lock()
        self._running = 0
        self._since = 0.0  # when the running count last rose from 0
        self._total = 0.0  # closed busy stretches

    def begin(self) -> float:
        with self._lock:
            now = self._clock()
            if self._running == 0:
                self._since = now
            self._running += 1
            return now

    def end(self, started: float) -> float:
        """Close a piece begun at ``started`` (what :meth:`begin` returned); its own wall time."""
        with self._lock:
            now = self._clock()
            self._running -= 1
            if self._running == 0:
                self._total += now - self._since
            return now - started

    @contextmanager
    def busy(self) -> Iterator[None]:
        started = self.begin()
        try:
            yield
        finally:
            self.end(started)

    def seconds(self) -> float:
        with self._lock:
            return self._total + (self._clock() - self._since if self._running else 0.0)


def overlap_share(start: float, end: float, window_start: float, window_end: float) -> float:
    """The share of the span ``[start, end]`` that lies in ``[window_start, window_end]`` (0 to 1); a span of no
    length counts whole where it lies in the window."""
    if end <= start:
        return 1.0 if window_start <= start <= window_end else 0.0
    return max(0.0, min(end, window_end) - max(start, window_start)) / (end - start)


def covered_seconds(spans: Iterable[tuple[float, float]], window_start: float, window_end: float) -> float:
    """Seconds of ``[window_start, window_end]`` inside at least one of ``spans`` ((start, end) pairs; overlapping
    spans counted once)."""
    clipped = sorted((max(s, window_start), min(e, window_end)) for s, e in spans)
    total, reach = 0.0, window_start
    for s, e in clipped:
        if e > max(s, reach):
            total += e - max(s, reach)
            reach = e
    return total


class SpanLog:
    """The spans (start, end, tokens) of engine calls or played groups, and the starts of those still out: what
    overlapped a window (an update). ``begin()`` / ``end(span, tokens)`` from the producer's thread; the queries
    from any thread."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, keep: int = 1 << 16):
        self._clock = clock
        self.done: deque[tuple[float, float, int]] = deque(maxlen=keep)
        self._open: dict[int, float] = {}
        self._ids = itertools.count()

    def begin(self) -> int:
        span = next(self._ids)
        self._open[span] = self._clock()
        return span

    def end(self, span: int, tokens: int) -> None:
        self.done.append((self._open.pop(span), self._clock(), tokens))

    def tokens_in(self, start: float, end: float) -> float:
        """Each finished span's tokens in the share of its time inside ``[start, end]`` (an even rate over it)."""
        return sum(overlap_share(s, e, start, end) * n for s, e, n in list(self.done))

    def seconds_in(self, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` in which any span was out, the spans still out included."""
        now = self._clock()
        spans = [(s, e) for s, e, _ in list(self.done)] + [(s, now) for s in list(self._open.values())]
        return covered_seconds(spans, start, end)
