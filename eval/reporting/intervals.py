"""Intervals for one quantity over independent draws: a mean (the t-interval), a median
(distribution-free, for benchmark ratios) and a band around a curve pooled over runs.

The comparisons, contrasts and accuracies of the reports are in eval/reporting/stats.py; these are
the simpler intervals of single quantities that the diagnostics, plots and benchmarks print
(lengths measured on a grid of evaluated lengths get none: they are reported as the grid
values they fall between, eval/lm/context_use.py and eval/tasks/effective_length.py).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ropelab.eval.reporting.stats import Z95, scipy_stats, t_quantile


# --- curves and benchmark ratios ------------------------------------------------------------


def pooled_curve(curves: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) per position bin of several runs' curves: the mean over seeds, and a
    95% band ±1.96·sd/√n from the spread of per-window bin means pooled over all windows."""
    n = np.array([c["n"] for c in curves], dtype=np.float64)
    means = np.array([c["mean"] for c in curves])
    sds = np.array([c["sd"] for c in curves])
    mean = means.mean(axis=0)
    pooled_mean = (means * n[:, None]).sum(axis=0) / n.sum()
    within = ((n[:, None] - 1) * sds ** 2).sum(axis=0)
    between = (n[:, None] * (means - pooled_mean) ** 2).sum(axis=0)
    sd = np.sqrt((within + between) / max(n.sum() - 1, 1))
    half = Z95 * sd / np.sqrt(n.sum())
    return mean, mean - half, mean + half


def median_interval(values: list[float], level: float = 0.95) -> Optional[tuple[float, float]]:
    """A distribution-free interval for the median of ``values`` (independent draws of a
    continuous quantity), or None when there are too few for ``level``.

    The order statistics x(k) and x(n−k+1) bracket the population median with probability
    1 − 2·P(B ≤ k−1), B ~ Binomial(n, 1/2) (the sign-test interval; e.g. Conover,
    *Practical Nonparametric Statistics*, 3rd ed., §3.2): the largest k whose coverage is at
    least ``level`` is taken. At 95% it needs n ≥ 6 (x(1), x(6): 96.9%); n = 10 gives
    (x(2), x(9)), 97.9%. Used for benchmark ratios, whose spread between processes on a
    shared machine is not normal.
    """
    x = sorted(values)
    n = len(x)
    # coverage[k - 1] of (x(k), x(n−k+1)) for k = 1 .. n//2; it falls as k grows.
    coverage = 1 - 2 * scipy_stats().binom.cdf(np.arange(n // 2), n, 0.5)
    k = int(np.count_nonzero(coverage >= level))
    if k == 0:
        return None
    return x[k - 1], x[n - k]


# --- a mean with its t-interval ------------------------------------------------------------


def t_interval(values, level: float = 0.95):
    """(mean, low, high) of independent draws ``values`` along axis 0: mean ± t(n−1)·s/√n, the
    t-interval (exact for normal draws), elementwise for arrays of draws; low and high are
    None for fewer than two draws."""
    x = np.asarray(values, dtype=np.float64)
    mean = x.mean(axis=0)
    if x.shape[0] < 2:
        return mean, None, None
    half = t_quantile(0.5 + level / 2, x.shape[0] - 1) * x.std(axis=0, ddof=1) / math.sqrt(x.shape[0])
    return mean, mean - half, mean + half

