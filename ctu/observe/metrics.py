"""Evaluation metrics as pure functions: pass^k, pass@k, rates and means over episodes."""

from __future__ import annotations

import resource
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from math import comb


def pass_hat_k(successes: int, samples: int, k: int) -> float:
    """tau-bench's pass^k for one task: the chance that k samples drawn without replacement all succeed."""
    _check(successes, samples, k)
    return comb(successes, k) / comb(samples, k)


def pass_at_k(successes: int, samples: int, k: int) -> float:
    """pass@k for one task: the chance that at least one of k samples drawn without replacement succeeds."""
    _check(successes, samples, k)
    return 1.0 - comb(samples - successes, k) / comb(samples, k)


def _check(successes: int, samples: int, k: int) -> None:
    if not 0 <= successes <= samples or not 1 <= k <= samples:
        raise ValueError(f"need 0 <= successes <= samples and 1 <= k <= samples, got {successes}, {samples}, {k}")


def pass_curves(per_task: Mapping[str, Sequence[bool]]) -> dict[str, dict[int, float]]:
    """Mean pass^k and pass@k over tasks for k = 1..min samples; {} for no tasks."""
    counts = [(sum(map(bool, r)), len(r)) for r in per_task.values() if len(r) > 0]
    if not counts:
        return {"pass^k": {}, "pass@k": {}}
    kmax = min(n for _, n in counts)
    return {
        "pass^k": {k: sum(pass_hat_k(c, n, k) for c, n in counts) / len(counts) for k in range(1, kmax + 1)},
        "pass@k": {k: sum(pass_at_k(c, n, k) for c, n in counts) / len(counts) for k in range(1, kmax + 1)},
    }


def mean(values: Iterable[float]) -> float:
    """The mean, 0.0 for nothing (never a crash on empty lists: eval before train may see none)."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def distribution(labels: Iterable[str]) -> dict[str, int]:
    return dict(sorted(Counter(labels).items()))


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, in GiB (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20
