"""Confidence intervals for held-out success, as small pure functions.

* :func:`bootstrap_ci`: percentile bootstrap of a mean over tasks (one value per task: its success rate);
* :func:`paired_change_ci`: the change between two evaluations of the same tasks (warm start -> final),
  bootstrapped over tasks with each task's pair kept together;
* :func:`t_interval` / :func:`seeds_summary`: across seeds (a handful of runs), Student's t.

Resampling uses its own ``random.Random(seed)`` and pure-Python sums, so an interval is the same on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import sqrt
from statistics import NormalDist

# Student's t, 97.5% quantile (two-sided 95%) for 1..30 degrees of freedom
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"

    def signed(self) -> str:
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    position = q * (len(ordered) - 1)
    lo = int(position)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (position - lo)


def bootstrap_ci(values: Sequence[float], level: float = 0.95, resamples: int = 2000, seed: int = 0) -> Interval:
    """The mean of ``values`` and its percentile-bootstrap interval: ``resamples`` draws of len(values) values
    with replacement; the interval is the (1-level)/2 and (1+level)/2 quantiles of their means."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("bootstrap_ci: no values")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap_ci: level must be in (0, 1), got {level}")
    rng = random.Random(seed)
    means = sorted(_mean(rng.choices(values, k=len(values))) for _ in range(resamples))
    center = _mean(values)
    low, high = _quantile(means, (1 - level) / 2), _quantile(means, (1 + level) / 2)
    # a mean of equal values can differ from center in the last bits when summed in another order
    ulp = 1e-12 * max(1.0, abs(center))
    low = center if abs(low - center) <= ulp else low
    high = center if abs(high - center) <= ulp else high
    return Interval(center, low, high, len(values))


def paired_change_ci(before: Mapping[str, float], after: Mapping[str, float], level: float = 0.95,
                     resamples: int = 2000, seed: int = 0) -> Interval:
    """The mean change ``after - before`` over the same tasks (keys), bootstrapped over tasks: each resampled task
    brings both its values, so tasks that are easy (or hard) in both evaluations add no spurious spread."""
    if set(before) != set(after):
        odd = sorted(set(before) ^ set(after))
        raise ValueError(f"paired_change_ci: the two evaluations cover different tasks, e.g. {odd[:3]}")
    keys = sorted(before)
    return bootstrap_ci([after[k] - before[k] for k in keys], level, resamples, seed)


def t_quantile_975(df: int) -> float:
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = NormalDist().inv_cdf(0.975)  # Cornish-Fisher expansion in 1/df: within 1e-4 beyond df 30
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and Student's t interval (two-sided 95% only); one value gives a degenerate interval."""
    if level != 0.95:
        raise ValueError(f"t_interval: only level 0.95 is tabulated, got {level}")
    values = [float(v) for v in values]
    if not values:
        raise ValueError("t_interval: no values")
    center = _mean(values)
    if len(values) == 1:
        return Interval(center, center, center, 1)
    sd = sqrt(sum((v - center) ** 2 for v in values) / (len(values) - 1))
    half = t_quantile_975(len(values) - 1) * sd / sqrt(len(values))
    return Interval(center, center - half, center + half, len(values))


def seeds_summary(values: Sequence[float]) -> dict[str, float]:
    """Across seeds: mean, min, max and the t interval's bounds."""
    ci = t_interval(values)
    return {"n": ci.n, "mean": ci.mean, "min": min(values), "max": max(values), "low": ci.low, "high": ci.high}
