"""Uncertainty for evaluation results: bootstrap intervals and paired comparisons for
perplexity, binomial intervals for accuracies, bands for per-position curves.

Every estimate the reports print carries an interval from here, so each method is
written down once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

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


# --- perplexity: a two-stage bootstrap over seeds and documents ------------------------------
#
# A report cell pools the runs of one experiment that differ only in seed, all scored on
# the same windows of the same tokens. Each bootstrap replicate draws the seeds with
# replacement and, independently, the units (documents, or blocks of windows where a
# corpus has few documents) with replacement; the units drawn are shared by every run of
# the replicate, because every run scored the same tokens. The statistic is the mean over
# the drawn seeds of each seed's NLL on the drawn units (total NLL / total tokens); the
# 95% interval is the 2.5 and 97.5 percentiles, reported as perplexities. With three
# seeds the seed stage sees only three values, so the between-seed part of the interval
# is approximate (Davison & Hinkley 1997, §3.8 on two-stage resampling).
#
# A paired comparison of two cells draws the units once for both, so it measures the
# difference on identical tokens; seeds are drawn jointly when both cells come from the
# same runs (two RoPE scalings of one model) and independently otherwise. A difference
# is significant at 5% when the interval of the perplexity ratio excludes 1.

N_BOOT = 2000
BOOT_SEED = 0  # fixed, so a report regenerates to the same digits


@dataclass
class Cell:
    """The per-unit sums of one cell: NLL (seeds × units) and tokens/bytes per unit."""

    nll: np.ndarray  # (S, U) summed NLL of each seed's run on each unit
    tokens: np.ndarray  # (U,)
    bytes: Optional[np.ndarray] = None  # (U,)
    runs: tuple[str, ...] = ()  # run directories, in the order of nll's rows


def _unit_weights(n_units: int, rng: np.random.Generator) -> np.ndarray:
    """(N_BOOT, U) multiplicities of a resample of the units with replacement."""
    return rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=N_BOOT).astype(np.float64)


def _seed_means(cell: Cell, weights: np.ndarray, seeds: np.ndarray, per: np.ndarray) -> np.ndarray:
    """Per replicate: the mean over drawn seeds of NLL per token (or per byte via ``per``)."""
    per_seed = (weights @ cell.nll.T) / (weights @ per)[:, None]  # (N_BOOT, S)
    return np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)


def cell_interval(cell: Cell, per_byte: bool = False) -> tuple[float, float, float]:
    """(point, low, high): perplexity (or bits per byte) with its 95% bootstrap interval."""
    per = cell.bytes if per_byte else cell.tokens
    rng = np.random.default_rng(BOOT_SEED)
    weights = _unit_weights(len(per), rng)
    seeds = rng.integers(0, cell.nll.shape[0], size=(N_BOOT, cell.nll.shape[0]))
    point = float((cell.nll.sum(axis=1) / per.sum()).mean())
    boot = _seed_means(cell, weights, seeds, per)
    low, high = np.percentile(boot, [2.5, 97.5])
    if per_byte:
        return point / math.log(2), float(low) / math.log(2), float(high) / math.log(2)
    return math.exp(point), math.exp(float(low)), math.exp(float(high))


def paired_ratio(a: Cell, b: Cell) -> tuple[float, float, float]:
    """(ratio, low, high): perplexity of ``a`` over ``b`` on the same tokens, 95% interval."""
    if a.tokens.shape != b.tokens.shape or not np.array_equal(a.tokens, b.tokens):
        raise ValueError("a paired comparison needs both cells scored on the same tokens")
    rng = np.random.default_rng(BOOT_SEED)
    weights = _unit_weights(len(a.tokens), rng)
    seeds_a = rng.integers(0, a.nll.shape[0], size=(N_BOOT, a.nll.shape[0]))
    seeds_b = seeds_a if a.runs == b.runs else rng.integers(0, b.nll.shape[0], size=(N_BOOT, b.nll.shape[0]))
    diff = _seed_means(a, weights, seeds_a, a.tokens) - _seed_means(b, weights, seeds_b, b.tokens)
    point = float((a.nll.sum(axis=1) / a.tokens.sum()).mean() - (b.nll.sum(axis=1) / b.tokens.sum()).mean())
    low, high = np.percentile(diff, [2.5, 97.5])
    return math.exp(point), math.exp(float(low)), math.exp(float(high))


def significance(low: float, high: float) -> str:
    """▼ significantly lower (better) perplexity, ▲ significantly higher, ~ neither."""
    return "▼" if high < 1.0 else "▲" if low > 1.0 else "~"


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


# --- accuracies pooled over seeds ----------------------------------------------------------


def pooled_accuracy_interval(counts: list[tuple[int, int]]) -> tuple[float, float]:
    """95% interval of an accuracy pooled over seeds, from each seed's (correct, total).

    The Wilson interval of the pooled instances alone treats every instance as independent,
    but a task is often learned by one seed and not another: three seeds at 1.00, 0.00 and
    0.00 pool to 0.33 with a Wilson interval of ±0.05. So the interval is the hull of that
    Wilson interval and a two-stage bootstrap (seeds drawn with replacement, then each drawn
    seed's correct count as Binomial(total, its accuracy); the 2.5 and 97.5 percentiles of
    the pooled accuracy): seeds that disagree widen it, and it never comes out narrower
    than the instances allow (the bootstrap alone collapses to a point at 0 or 1). One seed
    gets the Wilson interval.
    """
    correct = np.array([c for c, _ in counts], dtype=np.int64)
    total = np.array([n for _, n in counts], dtype=np.int64)
    low, high = wilson_interval(int(correct.sum()), int(total.sum()))
    if len(counts) < 2:
        return low, high
    rng = np.random.default_rng(BOOT_SEED)
    seeds = rng.integers(0, len(counts), size=(N_BOOT, len(counts)))
    drawn = rng.binomial(total[seeds], correct[seeds] / total[seeds])
    boot = drawn.sum(axis=1) / total[seeds].sum(axis=1)
    boot_low, boot_high = np.percentile(boot, [2.5, 97.5])
    return min(low, float(boot_low)), max(high, float(boot_high))


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
    below = 0.0  # P(B <= k-1), grown one k at a time
    k = 0
    while k < n // 2:
        nxt = below + math.comb(n, k) / 2**n
        if 1 - 2 * nxt < level:
            break
        below, k = nxt, k + 1
    if k == 0:
        return None
    return x[k - 1], x[n - k]


# --- a mean with its t-interval ------------------------------------------------------------


def _t_central_mass(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's t with integer ``df`` degrees of freedom, in closed form
    (Abramowitz & Stegun 1964, 26.7.3 for odd df, 26.7.4 for even)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 0:  # sinθ·(1 + ½cos²θ + (1·3)/(2·4)cos⁴θ + … ), df/2 terms
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total
    term = total = math.cos(theta)  # (2/π)(θ + sinθ·(cosθ + ⅔cos³θ + … )), (df−1)/2 terms
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + (math.sin(theta) * total if df > 1 else 0.0))


def t_quantile(level: float, df: int) -> float:
    """The t with P(|T| ≤ t) = ``level`` (two-sided), e.g. 12.706 at 95% and df = 1, by bisection."""
    if df < 1:
        raise ValueError(f"a t quantile needs df >= 1 (got {df})")
    low, high = 0.0, 1.0
    while _t_central_mass(high, df) < level:
        low, high = high, 2 * high
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_central_mass(mid, df) < level else (low, mid)
    return (low + high) / 2


def t_interval(values, level: float = 0.95):
    """(mean, low, high) of independent draws ``values`` along axis 0: mean ± t(n−1)·s/√n, the
    t-interval (exact for normal draws), elementwise for arrays of draws; low and high are
    None for fewer than two draws."""
    x = np.asarray(values, dtype=np.float64)
    mean = x.mean(axis=0)
    if x.shape[0] < 2:
        return mean, None, None
    half = t_quantile(level, x.shape[0] - 1) * x.std(axis=0, ddof=1) / math.sqrt(x.shape[0])
    return mean, mean - half, mean + half
