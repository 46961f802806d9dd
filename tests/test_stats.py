"""Intervals against values computed by hand from their definitions."""

from __future__ import annotations

import math

import pytest

from eval.stats import wilson_interval


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
