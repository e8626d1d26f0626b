"""CPU time of one call, for the tests that bound an algorithm's cost (linear, not quadratic)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any


def thread_cpu_seconds(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """(``fn(*args)``, the CPU seconds this thread spent in it), the collector off: neither other processes on a
    loaded machine, nor other threads of a long pytest run, nor a full collection of its large heap count
    (``time.process_time`` counted the last two: a JSON-array read of ~0.3 s measured 1.41 s in a full unit run)."""
    gc.collect()
    gc.disable()
    try:
        started = time.thread_time()
        result = fn(*args)
        return result, time.thread_time() - started
    finally:
        gc.enable()
