"""Uncertainty for evaluation results: binomial intervals for accuracies.

Every estimate the reports print carries an interval from here, so the method is written
down once.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion (Wilson 1927).

    Unlike the normal approximation it stays inside [0, 1] and is not degenerate at 0 or
    n successes, which is where exact-match accuracies of length generalization live.
    """
    if trials < 1:
        raise ValueError(f"an interval needs at least one trial (got {trials})")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}] (got {successes})")
    p, n = successes / trials, trials
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)
