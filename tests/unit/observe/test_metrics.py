import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctu.observe.metrics import distribution, mean, pass_at_k, pass_curves, pass_hat_k


def brute(successes, samples, k, all_of):
    outcomes = [True] * successes + [False] * (samples - successes)
    draws = list(itertools.combinations(range(samples), k))
    good = sum((all if all_of else any)(outcomes[i] for i in d) for d in draws)
    return good / len(draws)


@given(st.integers(1, 7).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n), st.integers(1, n))))
def test_pass_k_match_enumeration_of_draws(args):
    c, n, k = args
    assert pass_hat_k(c, n, k) == pytest.approx(brute(c, n, k, True))
    assert pass_at_k(c, n, k) == pytest.approx(brute(c, n, k, False))


def test_curves_and_edge_cases():
    curves = pass_curves({"a": [True, True, False, False], "b": [True, False, False, False]})
    assert curves["pass^k"][1] == pytest.approx(0.375) and curves["pass^k"][2] == pytest.approx((1 / 6) / 2)
    assert curves["pass@k"][4] == 1.0
    assert pass_curves({}) == {"pass^k": {}, "pass@k": {}}
    assert mean([]) == 0.0 and distribution([]) == {}
    with pytest.raises(ValueError):
        pass_hat_k(3, 2, 1)


def test_peak_rss_is_reported_in_gib_and_sees_an_allocation():
    import re
    from pathlib import Path

    import numpy as np

    from ctu.observe.metrics import peak_rss_gib

    def current_gib() -> float:  # VmRSS from the kernel, in kB
        return int(re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) / 2**20

    x = np.ones(2**27)  # 1 GiB, touched: the current RSS is at least that now
    now = current_gib()
    peak = peak_rss_gib()
    assert now >= 1.0
    assert now * 0.99 <= peak <= 1024  # GiB, not KiB or MiB, and a peak is never below the current RSS
    del x
