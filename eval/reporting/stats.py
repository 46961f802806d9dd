"""Uncertainty for evaluation results: intervals across documents and across training runs,
paired comparisons, multiple-comparison marks, power, and binomial intervals.

Every estimate the reports print carries an interval from here or from eval/reporting/intervals.py
(a mean, a median, lengths and curves over independent draws), so each method is written
down once.

Two statements, never mixed
---------------------------
A perplexity cell pools the runs of one experiment that differ only in the seed, all
scored on the same units (documents, or groups of consecutive documents). Its per-unit
NLL sums form a seeds × units table ``x[k, u]`` with token counts ``t[u]`` shared by the
seeds; seed k's mean NLL per token is ``m[k] = Σ_u x[k, u] / T``.

- **Across documents, for these trained models** (``Contrast.documents``): the models
  are held fixed and the units are the sample. The estimate is the mean over seeds of
  ``m[k]``; its variance is the ratio estimator's (Cochran 1977, §6.4): with
  ``z[u] = (x̄[u] − m̄·t[u]) / T`` (x̄ the seed-averaged sums), ``V_doc = U/(U−1)·Σ z[u]²``,
  on U − 1 degrees of freedom. This says how sure we are of *these* models' numbers.
- **Across training runs** (``Contrast.runs``): what another set of training runs, scored
  on other documents of the same corpus, would give. The seed part is the spread of the
  per-seed values, ``V_seed = s²/S`` on S − 1 degrees of freedom; the document part
  ``V_doc`` is added, and the t quantile uses the Welch–Satterthwaite degrees of freedom
  of the sum (Satterthwaite 1946; guarded, see ``satterthwaite``). The seed-by-document interaction enters both parts,
  so the interval errs on the wide side; tests/unit/test_stats.py simulates known seed and
  document variances at 2, 3, 5 and 10 seeds and checks that it covers the true value at
  least 93% of the time at a nominal 95% (a percentile bootstrap over 3 seeds covers
  about 76%). A ranking is a claim about the method, so marks use this interval only.

Comparisons and contrasts
-------------------------
A comparison is a contrast Σ wᵢ·cellᵢ of mean log-perplexities (e.g. row − reference,
or a row at 16L − the same row at L, or a difference of such ratios). Cells whose rows
share the same seeds are **paired by seed** (rows trained with seed k share seed k's
data order, and its initialisation where shapes agree): the contrast is formed per seed
and its spread over seeds is the seed part. Rows with different seed sets are compared
unpaired (Welch: each row's seed variance over its own seeds). Cells scored on the same
units are paired by unit in the document part; cells on different units (another length
under a protocol that scores other tokens there) add their document variances.

Fine-tunes of several parents
-----------------------------
Runs fine-tuned from several parents (a context-extension grid: P parents × F fine-tuning
seeds) are not P·F independent replicates: fine-tunes of one parent share its weights, so
they differ from each other less than from another parent's. Each run carries its
replicate unit (``Cell.units``: the parent's run for a fine-tune, the run itself
otherwise; eval/reporting/labels.py ``replicate_unit``), and where units are shared the seed part is
formed from the units' means (each run's value, or per-seed contrast, averaged within its
parent first), on C − 1 degrees of freedom for C parents; the point and the document part
weight every parent equally. With the same number of fine-tunes per parent, the spread of
the parents' means over C is unbiased for the variance of the grand mean (two-stage
sampling with primary units of equal size; Cochran 1977, ch. 10); counting the P·F runs
as independent understates it whenever parents differ (tests/unit/test_stats.py simulates
both). An estimate's ``seeds`` then counts parents, and so do ``detectable`` and
``seeds_needed``. The fine-tunes of a single parent stay the units: their interval speaks
of that parent alone.

A table's marks (▼ lower, ▲ higher perplexity) say the across-runs test rejects no change
after the Benjamini–Hochberg correction over the table's comparisons (a 5% false discovery
rate among its marks; Holm's family-wise correction over the hundred-odd comparisons of a
study table would leave three seeds unable to mark even a 19% difference); each printed
interval is the unadjusted 95% one. ``detectable`` and ``seeds_needed`` give the power
side: the smallest difference the current seeds detect at 80% power (two-sided 5%), and
how many seeds a given difference needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

LEVEL = 0.95
ALPHA = 1 - LEVEL
POWER = 0.8
MAX_SEEDS = 100  # seeds_needed looks no further
# The 97.5% quantile of the standard normal, as scipy's norm.ppf(0.975) gives it to the last
# digit (tests/unit/test_stats.py checks); a literal so that importing this module does not import
# scipy.stats (~0.7 s), which evaluation subprocesses that only fill perplexity caches never use.
Z95 = 1.959963984540054


def scipy_stats():
    """scipy.stats, imported at first use (see Z95)."""
    from scipy import stats
    return stats


def wilson_interval(successes: int, trials: int, level: float = LEVEL) -> tuple[float, float]:
    """The two-sided Wilson score interval for a binomial proportion (Wilson 1927), as scipy's
    ``binomtest(...).proportion_ci(method="wilson")`` computes it (Newcombe 1998).

    Unlike the normal approximation it stays inside [0, 1] and is not degenerate at 0 or
    n successes, which is where exact-match accuracies of length generalization live.
    """
    if trials < 1:
        raise ValueError(f"an interval needs at least one trial (got {trials})")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}] (got {successes})")
    found = scipy_stats().binomtest(successes, trials).proportion_ci(confidence_level=level, method="wilson")
    return float(found.low), float(found.high)


# --- estimates --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One variance component: ``per_seed`` is s² (a seed part, variance of one seed's
    value, divided by ``seeds``) or the variance itself (a document part, seeds = 0)."""

    variance: float
    df: float
    per_seed: Optional[float] = None  # s² of a seed part; None for a document part
    seeds: int = 0


@dataclass(frozen=True)
class Estimate:
    """A point estimate (mean log-perplexity, a difference of them, or an accuracy) with
    its standard error from variance ``parts`` and Satterthwaite's degrees of freedom."""

    point: float
    parts: tuple[Part, ...]
    seeds: int  # the fewest seeds behind any term
    pairing: str = "seed"  # "seed": paired by seed; "welch": rows with different seeds

    @property
    def variance(self) -> float:
        return sum(p.variance for p in self.parts)

    @property
    def se(self) -> float:
        return math.sqrt(self.variance)

    @property
    def df(self) -> float:
        return satterthwaite(self.parts)

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        half = t_quantile(0.5 + level / 2, self.df) * self.se
        return self.point - half, self.point + half

    @property
    def p_value(self) -> float:
        """Two-sided p-value of 'the true value is 0'."""
        if self.se == 0:
            return 1.0 if self.point == 0 else 0.0
        return float(2 * scipy_stats().t.sf(abs(self.point) / self.se, self.df))


def satterthwaite(parts: Sequence[Part]) -> float:
    """Degrees of freedom of a sum of independent variance estimates (Satterthwaite 1946),
    each seed part taken at its 75% upper confidence bound s²·(S−1)/χ²₀.₂₅(S−1) for this
    purpose only: with 3 seeds a seed variance that comes out small by chance would
    otherwise hand the sum the document part's many degrees of freedom exactly when the
    standard error is already too small (plain Satterthwaite covers ~92% in the mixed
    regime of tests/unit/test_stats.py; this ≥ 94.5% there, and the same width elsewhere)."""
    chi2 = scipy_stats().chi2
    guarded = [(p.variance * (p.df / float(chi2.ppf(0.25, p.df))) if p.per_seed is not None and p.df > 0
                else p.variance, p.df) for p in parts]
    total = sum(v for v, _ in guarded)
    denominator = sum(v ** 2 / df for v, df in guarded if df > 0 and v > 0)
    return total ** 2 / denominator if denominator > 0 else math.inf


def t_quantile(q: float, df: float) -> float:
    stats = scipy_stats()
    return float(stats.norm.ppf(q)) if math.isinf(df) else float(stats.t.ppf(q, df))


def clustered(units: Sequence[str]) -> bool:
    """Whether runs with these replicate units are fewer independent replicates than runs:
    at least two units, one of them shared by several runs."""
    return 2 <= len(set(units)) < len(units)


def unit_weights(runs: int, units: Sequence[str] = ()) -> np.ndarray:
    """(runs,) weights of a mean in which every unit counts once: 1/(C·n_c) for a run of
    unit c (C units, n_c runs in c) where ``clustered``, else 1/runs."""
    if not clustered(units):
        return np.full(runs, 1.0 / runs)
    if len(units) != runs:
        raise ValueError(f"{len(units)} units for {runs} runs")
    size = {u: units.count(u) for u in units}
    return np.array([1.0 / (len(size) * size[u]) for u in units])


def unit_means(values: np.ndarray, units: Sequence[str] = ()) -> np.ndarray:
    """``values`` (one per run, along axis 0) averaged within each unit, in the order units
    first appear, where ``clustered``; else unchanged."""
    if not clustered(units):
        return values
    if len(units) != len(values):
        raise ValueError(f"{len(units)} units for {len(values)} runs")
    order = list(dict.fromkeys(units))
    return np.array([np.mean([v for v, u in zip(values, units) if u == unit], axis=0) for unit in order])


@dataclass
class Cell:
    """The per-unit sums of one cell: NLL (seeds × units) and tokens/bytes per unit."""

    nll: np.ndarray  # (S, U) summed NLL of each seed's run on each unit
    tokens: np.ndarray  # (U,)
    bytes: Optional[np.ndarray] = None  # (U,)
    runs: tuple[str, ...] = ()  # run directories, in the order of nll's rows
    seeds: tuple[int, ...] = ()  # each run's train.seed, in the same order (pairing by seed)
    units: tuple[str, ...] = ()  # each run's replicate unit (see "Fine-tunes of several parents")

    def per(self, per_byte: bool = False) -> np.ndarray:
        if per_byte and self.bytes is None:
            raise ValueError("this cell has no byte counts")
        return self.bytes if per_byte else self.tokens

    def seed_values(self, per_byte: bool = False) -> np.ndarray:
        """(S,) each seed's mean NLL per token (or per byte)."""
        return self.nll.sum(axis=1) / self.per(per_byte).sum()

    def weights(self) -> np.ndarray:
        """(S,) each run's weight in the cell's mean: every replicate unit counts once."""
        return unit_weights(self.nll.shape[0], self.units)

    @property
    def replicates(self) -> int:
        """The independent training runs behind the cell: its units, where several runs share one."""
        return len(set(self.units)) if clustered(self.units) else self.nll.shape[0]

    @property
    def seed_key(self) -> tuple:
        # Units join the key only where runs share them (fine-tunes): rows of different runs
        # with the same seeds pair seed by seed, fine-tunes also by parent.
        return (self.seeds or self.runs or tuple(range(self.nll.shape[0])),
                self.units if clustered(self.units) else ())


@dataclass(frozen=True)
class Contrast:
    """Σ wᵢ·(mean log-perplexity of cell i): the point, and its two intervals."""

    point: float
    documents: Estimate  # across documents, these trained models held fixed
    runs: Optional[Estimate]  # across training runs and documents; None with one seed
    note: str = ""  # why ``runs`` is missing, or how the rows were paired


def _document_parts(terms: Sequence[tuple[float, Cell]], per_byte: bool) -> list[Part]:
    """One part per distinct set of units: the ratio estimator's variance of the
    seed-averaged contrast, cells on the same units paired unit by unit."""
    by_units: dict[bytes, np.ndarray] = {}
    for weight, cell in terms:
        per = cell.per(per_byte)
        w = cell.weights()
        z = weight * (w @ cell.nll - float(w @ cell.seed_values(per_byte)) * per) / per.sum()
        key = per.tobytes() + cell.tokens.tobytes()
        by_units[key] = by_units[key] + z if key in by_units else z
    parts = []
    for z in by_units.values():
        n = len(z)
        parts.append(Part(variance=n / (n - 1) * float((z ** 2).sum()) if n > 1 else 0.0, df=n - 1))
    return parts


def _seed_parts(terms: Sequence[tuple[float, Cell]], per_byte: bool) -> tuple[list[Part], str]:
    """The seed part(s): per-seed contrasts when every term has the same seeds, else one
    part per seed set (Welch). Empty when some set has a single seed."""
    groups: dict[tuple, np.ndarray] = {}
    for weight, cell in terms:
        values = weight * cell.seed_values(per_byte)
        key = cell.seed_key
        groups[key] = groups[key] + values if key in groups else values
    groups = {key: unit_means(values, key[1]) for key, values in groups.items()}
    if any(len(v) < 2 for v in groups.values()):
        return [], "one seed"
    parts = []
    for values in groups.values():
        s2 = float(np.var(values, ddof=1))
        parts.append(Part(variance=s2 / len(values), df=len(values) - 1, per_seed=s2, seeds=len(values)))
    return parts, "seed" if len(groups) == 1 else "welch"


def contrast(terms: Sequence[tuple[float, Cell]], per_byte: bool = False) -> Contrast:
    """The contrast Σ wᵢ·cellᵢ of mean log-perplexities (or log-bits per byte): see the
    module docstring for both intervals."""
    point = float(sum(w * (c.weights() @ c.seed_values(per_byte)) for w, c in terms))
    seeds = min(c.replicates for _, c in terms)
    doc_parts = _document_parts(terms, per_byte)
    documents = Estimate(point, tuple(doc_parts), seeds)
    seed_parts, pairing = _seed_parts(terms, per_byte)
    if not seed_parts:
        return Contrast(point, documents, None, "one seed: no interval across training runs")
    runs = Estimate(point, tuple(seed_parts + doc_parts), seeds, pairing)
    note = "" if pairing == "seed" else "unpaired: the rows were trained with different seeds (Welch)"
    return Contrast(point, documents, runs, note)


def cell_contrast(cell: Cell, per_byte: bool = False) -> Contrast:
    """One cell: its mean log-perplexity (log of bits·ln2 per byte with ``per_byte``)."""
    return contrast([(1.0, cell)], per_byte)


def paired_contrast(a: Cell, b: Cell) -> Contrast:
    """log(ppl a / ppl b) on the same tokens."""
    if a.tokens.shape != b.tokens.shape or not np.array_equal(a.tokens, b.tokens):
        raise ValueError("a paired comparison needs both cells scored on the same tokens")
    return contrast([(1.0, a), (-1.0, b)])


# --- marks, multiplicity and power ------------------------------------------------------------


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (Benjamini & Hochberg 1995), in the input order: a
    comparison is marked where its adjusted p is below 5%, which holds the expected share of
    false marks among a table's marks at 5%. Valid for comparisons that share a reference row
    (positively dependent; Benjamini & Yekutieli 2001)."""
    if not p_values:
        return []
    return [float(p) for p in scipy_stats().false_discovery_control(p_values, method="bh")]


def mark(point: float, adjusted_p: Optional[float], alpha: float = ALPHA) -> str:
    """▼ significantly lower (better) perplexity, ▲ significantly higher, ~ neither; '' when
    there is no across-runs test (one seed)."""
    if adjusted_p is None:
        return ""
    if adjusted_p >= alpha:
        return "~"
    return "▼" if point < 0 else "▲"


def _power_factor(df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    return t_quantile(1 - alpha / 2, df) + t_quantile(power, df)


def detectable(estimate: Estimate, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest |difference| a two-sided test at ``alpha`` detects with ``power``."""
    return _power_factor(estimate.df, alpha, power) * estimate.se


def with_seeds(estimate: Estimate, seeds: int) -> Estimate:
    """The estimate's standard error had every row ``seeds`` seeds (same variances)."""
    parts = tuple(Part(p.per_seed / seeds, seeds - 1, p.per_seed, seeds) if p.per_seed is not None else p
                  for p in estimate.parts)
    return Estimate(estimate.point, parts, seeds, estimate.pairing)


def seeds_needed(estimate: Estimate, difference: float, alpha: float = ALPHA, power: float = POWER,
                 most: int = MAX_SEEDS) -> Optional[int]:
    """Seeds per row for a difference of ``difference`` to be detected with ``power``, or
    None when even ``most`` seeds would not (the document part alone is too wide)."""
    if difference == 0:
        return None
    for seeds in range(2, most + 1):
        if detectable(with_seeds(estimate, seeds), alpha, power) <= abs(difference):
            return seeds
    return None


# --- accuracies pooled over seeds ----------------------------------------------------------


def accuracy_estimate(counts: Sequence[tuple[int, int]], units: Sequence[str] = ()) -> Estimate:
    """The mean over seeds of each seed's accuracy, across training runs and instances.

    Seed part: the spread of the per-seed accuracies (S − 1 df; with ``units`` that several
    runs share, of the units' mean accuracies, C − 1 df). Instance part: the binomial
    variance p̄(1 − p̄)/n of an average over the n instances every seed answers (the same
    instances: eval.tasks.seed), on n − 1 df. Needs ≥ 2 seeds (units).
    """
    acc = unit_means(np.array([c / n for c, n in counts], dtype=np.float64), units)
    n = float(np.mean([n for _, n in counts]))
    p = float(acc.mean())
    s2 = float(np.var(acc, ddof=1))
    parts = (Part(s2 / len(acc), len(acc) - 1, s2, len(acc)), Part(p * (1 - p) / n, n - 1))
    return Estimate(p, parts, len(acc))


def pooled_accuracy_interval(counts: list[tuple[int, int]], units: Sequence[str] = ()) -> tuple[float, float]:
    """95% interval of an accuracy pooled over seeds, from each seed's (correct, total).

    The Wilson interval of the pooled instances alone treats every instance as
    independent, but a task is often learned by one seed and not another: three seeds at
    1.00, 0.00 and 0.00 pool to 0.33 with a Wilson interval of ±0.05. So the interval is
    the hull of that Wilson interval and the across-runs t-interval of
    ``accuracy_estimate`` (clipped to [0, 1]): seeds that disagree widen it, and it is
    never narrower than the instances allow. One seed gets the Wilson interval.
    """
    low, high = wilson_interval(sum(c for c, _ in counts), sum(n for _, n in counts))
    if len(counts) < 2:
        return low, high
    t_low, t_high = accuracy_estimate(counts, units).interval()
    return max(0.0, min(low, t_low)), min(1.0, max(high, t_high))
