"""The intervals of single quantities (eval/reporting/intervals.py) against values computed by hand,
and their coverage checked by simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ropelab.eval.reporting.intervals import median_interval, pooled_curve, t_interval


def test_pooled_curve_band_by_hand():
    curves = [{"n": 4, "mean": [1.0, 2.0], "sd": [0.0, 1.0]}, {"n": 4, "mean": [3.0, 2.0], "sd": [0.0, 1.0]}]
    mean, low, high = pooled_curve(curves)
    assert mean.tolist() == [2.0, 2.0]
    # Bin 0: eight values, four 1s and four 3s: sd = sqrt(8 / 7); bin 1: sd = sqrt(6 / 7).
    assert (high - mean).tolist() == pytest.approx([1.959964 * math.sqrt(8 / 7) / math.sqrt(8),
                                                    1.959964 * math.sqrt(6 / 7) / math.sqrt(8)], rel=1e-5)


def test_median_interval_order_statistics_by_hand():
    """The sign-test interval: x(k), x(n-k+1) with the largest k covering >= 95%."""
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) is None  # n = 5 covers at most 93.8%
    assert median_interval([6, 1, 5, 2, 4, 3]) == (1, 6)  # 1 - 2/64 = 96.9%
    assert median_interval(list(range(1, 9))) == (1, 8)  # k = 2 would cover 1 - 18/256 = 93.0%
    assert median_interval(list(range(1, 10))) == (2, 8)  # 1 - 20/512 = 96.1%
    assert median_interval(list(range(1, 11))) == (2, 9)  # 1 - 22/1024 = 97.9%
    assert median_interval(list(range(1, 21)), level=0.5)[0] > median_interval(list(range(1, 21)))[0]


# k of the interval (x(k), x(n−k+1)) for n = 1 .. 60, 0 for none, as the running binomial sum
# gave it before scipy's binomial CDF replaced the sum (fb1bb84).
MEDIAN_K_BEFORE = {
    0.90: [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4, 5, 5, 6, 6, 6, 7, 7, 8, 8, 8, 9, 9, 10, 10, 11, 11, 11,
           12, 12, 13, 13, 14, 14, 14, 15, 15, 16, 16, 17, 17, 17, 18, 18, 19, 19, 20, 20, 21, 21, 21, 22, 22, 23, 23, 24],
    0.95: [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 5, 5, 5, 6, 6, 6, 7, 7, 8, 8, 8, 9, 9, 10, 10, 10,
           11, 11, 12, 12, 13, 13, 13, 14, 14, 15, 15, 16, 16, 16, 17, 17, 18, 18, 19, 19, 19, 20, 20, 21, 21, 22, 22, 22],
    0.99: [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 7, 7, 7, 8, 8, 8, 9,
           9, 10, 10, 10, 11, 11, 12, 12, 12, 13, 13, 14, 14, 14, 15, 15, 16, 16, 16, 17, 17, 18, 18, 18, 19, 19, 20, 20],
}


@pytest.mark.parametrize("level", sorted(MEDIAN_K_BEFORE))
def test_median_interval_picks_the_order_statistics_it_picked_before(level):
    for n, k in enumerate(MEDIAN_K_BEFORE[level], start=1):
        expected = None if k == 0 else (k - 1, n - k)
        assert median_interval(list(range(n)), level) == expected, n


def test_median_interval_covers_the_median_as_often_as_it_says():
    """Skewed draws (lognormal, median 1): coverage at least 95% for n = 6 … 12."""
    rng = np.random.default_rng(0)
    for n in range(6, 13):
        draws = rng.lognormal(0.0, 0.3, size=(4000, n))
        hits = [low <= 1.0 <= high for low, high in map(median_interval, draws.tolist())]
        assert np.mean(hits) >= 0.94, n


def test_t_intervals_by_hand_and_their_coverage_of_the_mean():
    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and (low, high) == pytest.approx((2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)), abs=1e-3)
    assert t_interval([5.0])[1:] == (None, None)
    rng = np.random.default_rng(0)  # coverage of a normal mean at n = 3: 95% in expectation
    draws = rng.normal(1.0, 2.0, size=(4000, 3))
    covered = [low <= 1.0 <= high for _, low, high in (t_interval(d) for d in draws)]
    assert 0.935 < np.mean(covered) < 0.965
    columns = t_interval(np.stack([draws[:5, 0], draws[:5, 1]], axis=1))  # elementwise along axis 0
    assert columns[0].shape == (2,) and columns[1][0] == pytest.approx(t_interval(draws[:5, 0])[1])

