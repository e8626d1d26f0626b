"""Confidence intervals for held-out success: percentile bootstrap over tasks, paired change, across seeds."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctu.observe.stats import Interval, bootstrap_ci, paired_change_ci, seeds_summary, t_interval

rates = st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=2, max_size=40)


@settings(max_examples=60, deadline=None)
@given(rates)
def test_the_interval_contains_the_mean(values):
    ci = bootstrap_ci(values, resamples=400)
    assert ci.low <= ci.mean <= ci.high
    assert ci.mean == pytest.approx(sum(values) / len(values), rel=1e-12, abs=1e-12)
    assert 0.0 <= ci.low and ci.high <= 1.0 and ci.n == len(values)


@settings(max_examples=40, deadline=None)
@given(rates.filter(lambda v: len(set(v)) > 1))
def test_the_interval_shrinks_with_more_tasks(values):
    one, four = bootstrap_ci(values, resamples=800), bootstrap_ci(values * 4, resamples=800)
    assert four.high - four.low < one.high - one.low
    assert four.mean == pytest.approx(one.mean, rel=1e-9, abs=1e-12)


@given(st.sampled_from([0.0, 0.3, 1.0]), st.integers(1, 30))
def test_all_equal_values_give_a_degenerate_interval(value, n):
    ci = bootstrap_ci([value] * n, resamples=200)
    assert ci.low == ci.mean == ci.high == pytest.approx(value, rel=1e-12, abs=0)


def test_the_interval_is_seeded_and_widens_with_the_level():
    values = [1.0] * 39 + [0.0] * 21
    assert bootstrap_ci(values) == bootstrap_ci(values)
    narrow, wide = bootstrap_ci(values, level=0.5), bootstrap_ci(values, level=0.99)
    assert wide.low < narrow.low and narrow.high < wide.high
    # n=60 at p=0.65: the normal approximation's half width is 1.96 * sqrt(p(1-p)/n) = 0.121
    ci = bootstrap_ci(values)
    assert (ci.high - ci.low) / 2 == pytest.approx(0.121, rel=0.12)


def test_no_values_is_an_error():
    with pytest.raises(ValueError, match="no values"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([1.0], level=1.5)


def test_the_paired_change_is_over_the_same_tasks():
    warm = {f"t{i}": float(i % 2) for i in range(40)}
    final = {k: 1.0 for k in warm}  # every task that failed now succeeds: +0.5 with certainty-ish
    change = paired_change_ci(warm, final)
    assert change.mean == pytest.approx(0.5, rel=1e-12) and change.low > 0.3 and change.n == 40
    # the same marginal rates, but which task succeeds is reshuffled: no paired gain at all
    same = paired_change_ci(warm, {k: 1.0 - v for k, v in warm.items()})
    assert same.mean == 0.0 and same.low < 0.0 < same.high
    with pytest.raises(ValueError, match="t40"):
        paired_change_ci(warm, {**final, "t40": 1.0})


def test_pairing_narrows_the_change_when_tasks_differ_in_difficulty():
    """Hard tasks fail in both, easy ones succeed in both: the paired interval of the change is far narrower than
    the two marginal intervals would suggest."""
    warm = {f"t{i}": 1.0 if i < 30 else 0.0 for i in range(60)}
    final = {**warm, "t30": 1.0, "t31": 1.0, "t32": 1.0}
    change = paired_change_ci(warm, final)
    w, f = bootstrap_ci(list(warm.values())), bootstrap_ci(list(final.values()))
    assert change.mean == pytest.approx(0.05, rel=1e-12) and change.low >= 0.0
    assert change.high - change.low < 0.5 * ((w.high - w.low) + (f.high - f.low)) / 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=2, max_size=12))
def test_t_interval_is_symmetric_and_contains_the_mean(values):
    ci = t_interval(values)
    assert ci.low <= ci.mean <= ci.high
    assert ci.mean - ci.low == pytest.approx(ci.high - ci.mean, rel=1e-9, abs=1e-12)


def test_t_interval_known_values():
    ci = t_interval([0.117, 0.100, 0.083])  # sd 0.017, t(2) = 4.303: half width 4.303 * 0.017 / sqrt(3)
    assert ci.mean == pytest.approx(0.1, rel=1e-12)
    assert ci.high - ci.mean == pytest.approx(4.303 * 0.017 / 3 ** 0.5, rel=1e-3)
    big = t_interval([0.0, 1.0] * 50)  # df 99: close to the normal 1.96
    assert big.high - big.mean == pytest.approx(1.984 * (100 / 99 * 0.25) ** 0.5 / 10, rel=2e-3)
    assert t_interval([0.2]) == Interval(0.2, 0.2, 0.2, 1)
    with pytest.raises(ValueError, match="level"):
        t_interval([0.1, 0.2], level=0.9)


def test_seeds_summary():
    s = seeds_summary([0.117, -0.067, 0.083])
    assert (s["min"], s["max"], s["n"]) == (-0.067, 0.117, 3)
    assert s["mean"] == pytest.approx(0.0443333, rel=1e-5) and s["low"] < s["min"] and s["high"] > s["max"]
