"""Intervals against values computed by hand from their definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eval.stats import (cell_interval, median_interval, paired_ratio, pooled_accuracy_interval, pooled_curve, significance,
                        wilson_interval)


def test_wilson_interval_by_hand():
    # 8 of 10: p = .8, z² = 3.8415; centre = (.8 + .19207)/1.38415 = .71674;
    # half = 1.95996/1.38415 * sqrt(.016 + .0096037) = .22664 -> (.4902, .9433).
    low, high = wilson_interval(8, 10)
    assert (low, high) == pytest.approx((0.49016, 0.94331), abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and 0 < wilson_interval(0, 20)[1] < 0.2
    assert wilson_interval(20, 20)[1] == 1.0 and wilson_interval(20, 20)[0] > 0.8
    low, high = wilson_interval(500, 1000)
    assert high - low == pytest.approx(2 * 1.95996 * math.sqrt(0.25 / 1000), rel=5e-3)  # ≈ Wald at large n
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def _cell(nll, tokens, runs=("a",)):
    from eval.stats import Cell
    return Cell(nll=np.atleast_2d(np.asarray(nll, dtype=np.float64)), tokens=np.asarray(tokens, dtype=np.float64),
                runs=runs)


def test_bootstrap_interval_matches_the_ratio_estimators_standard_error():
    """One seed: the percentile interval of the mean NLL ≈ ±1.96 of the delta-method SE of a
    ratio estimator Σx/Σn over resampled units (Cochran 1977, §6.4), computed by hand."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(50, 150, size=400).astype(np.float64)
    nll = tokens * rng.normal(4.0, 0.3, size=400)
    mean = nll.sum() / tokens.sum()
    resid = nll - mean * tokens
    se = np.sqrt(400 / 399 * (resid ** 2).sum()) / tokens.sum()
    point, low, high = cell_interval(_cell(nll, tokens))
    assert point == pytest.approx(math.exp(mean), rel=1e-12)
    assert math.log(high) - math.log(low) == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert low < point < high


def test_seed_spread_widens_the_interval():
    tokens = np.full(100, 100.0)
    base = np.random.default_rng(2).normal(400, 5, size=100)
    one = cell_interval(_cell(base, tokens))
    spread = cell_interval(_cell([base - 30, base, base + 30], tokens, runs=("a", "b", "c")))
    assert spread[0] == pytest.approx(one[0], rel=1e-12)  # the same mean NLL
    assert spread[2] - spread[1] > 3 * (one[2] - one[1])


def test_paired_comparison_sees_a_constant_shift_exactly():
    """b is a plus 0.01 nats on every token: the pairing cancels all document noise."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(50, 150, size=60).astype(np.float64)
    a_nll = tokens * rng.normal(4.0, 0.5, size=60)
    a, b = _cell(a_nll, tokens, ("x",)), _cell(a_nll + 0.01 * tokens, tokens, ("y",))
    ratio, low, high = paired_ratio(b, a)
    assert ratio == pytest.approx(math.exp(0.01)) and low == pytest.approx(ratio) and high == pytest.approx(ratio)
    assert significance(low, high) == "▲" and significance(1 / high, 1 / low) == "▼"
    # Unpaired, the same two cells' intervals overlap: only pairing detects the difference.
    assert cell_interval(b)[1] < cell_interval(a)[2]
    assert significance(0.98, 1.01) == "~"
    with pytest.raises(ValueError, match="same tokens"):
        paired_ratio(a, _cell(a_nll[:-1], tokens[:-1]))


def test_pooled_curve_band_by_hand():
    curves = [{"n": 4, "mean": [1.0, 2.0], "sd": [0.0, 1.0]}, {"n": 4, "mean": [3.0, 2.0], "sd": [0.0, 1.0]}]
    mean, low, high = pooled_curve(curves)
    assert mean.tolist() == [2.0, 2.0]
    # Bin 0: eight values, four 1s and four 3s: sd = sqrt(8 / 7); bin 1: sd = sqrt(6 / 7).
    assert (high - mean).tolist() == pytest.approx([1.959964 * math.sqrt(8 / 7) / math.sqrt(8),
                                                    1.959964 * math.sqrt(6 / 7) / math.sqrt(8)], rel=1e-5)


def test_a_pooled_accuracy_interval_counts_seeds_that_disagree():
    # One seed learned the task, two did not: 0.33 pooled, which ±0.05 (Wilson on 300
    # instances) would misstate; with three seeds the mean could be anywhere in [0, 1].
    low, high = pooled_accuracy_interval([(100, 100), (0, 100), (0, 100)])
    assert (low, high) == (0.0, 1.0)
    wilson = wilson_interval(100, 300)
    assert high - low > 5 * (wilson[1] - wilson[0])
    # Seeds that agree: the instances decide, and it is never narrower than Wilson.
    low, high = pooled_accuracy_interval([(50, 100), (50, 100), (50, 100)])
    wilson = wilson_interval(150, 300)
    assert low <= wilson[0] and high >= wilson[1] and high - low < 1.1 * (wilson[1] - wilson[0])
    # All wrong: not a point at 0 (the bootstrap alone would be), the Wilson upper bound.
    low, high = pooled_accuracy_interval([(0, 100)] * 3)
    assert low == 0.0 and high == wilson_interval(0, 300)[1] > 0.01
    assert pooled_accuracy_interval([(30, 100)]) == wilson_interval(30, 100)  # one seed
    assert pooled_accuracy_interval([(17, 100), (100, 100), (3, 100)]) == \
        pooled_accuracy_interval([(17, 100), (100, 100), (3, 100)])  # fixed resampling seed


def test_median_interval_order_statistics_by_hand():
    """The sign-test interval: x(k), x(n-k+1) with the largest k covering >= 95%."""
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) is None  # n = 5 covers at most 93.8%
    assert median_interval([6, 1, 5, 2, 4, 3]) == (1, 6)  # 1 - 2/64 = 96.9%
    assert median_interval(list(range(1, 9))) == (1, 8)  # k = 2 would cover 1 - 18/256 = 93.0%
    assert median_interval(list(range(1, 10))) == (2, 8)  # 1 - 20/512 = 96.1%
    assert median_interval(list(range(1, 11))) == (2, 9)  # 1 - 22/1024 = 97.9%
    assert median_interval(list(range(1, 21)), level=0.5)[0] > median_interval(list(range(1, 21)))[0]


def test_median_interval_covers_the_median_as_often_as_it_says():
    """Skewed draws (lognormal, median 1): coverage at least 95% for n = 6 … 12."""
    rng = np.random.default_rng(0)
    for n in range(6, 13):
        draws = rng.lognormal(0.0, 0.3, size=(4000, n))
        hits = [low <= 1.0 <= high for low, high in map(median_interval, draws.tolist())]
        assert np.mean(hits) >= 0.94, n


def test_t_quantiles_are_the_tables_and_t_intervals_cover_the_mean():
    from eval.stats import t_interval, t_quantile

    # Two-sided 95% points of Student's t (any statistics table).
    for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.95, df) == pytest.approx(t, abs=1e-3)
    assert t_quantile(0.95, 100_000) == pytest.approx(1.95996, abs=1e-4)
    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and (low, high) == pytest.approx((2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)), abs=1e-3)
    assert t_interval([5.0])[1:] == (None, None)
    rng = np.random.default_rng(0)  # coverage of a normal mean at n = 3: 95% in expectation
    draws = rng.normal(1.0, 2.0, size=(4000, 3))
    covered = [low <= 1.0 <= high for _, low, high in (t_interval(d) for d in draws)]
    assert 0.935 < np.mean(covered) < 0.965
    columns = t_interval(np.stack([draws[:5, 0], draws[:5, 1]], axis=1))  # elementwise along axis 0
    assert columns[0].shape == (2,) and columns[1][0] == pytest.approx(t_interval(draws[:5, 0])[1])
