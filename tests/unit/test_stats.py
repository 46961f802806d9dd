"""Intervals against values computed by hand from their definitions, and coverage checked by
simulating seeds and documents with known variances."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from ropelab.eval.reporting.stats import (Cell, accuracy_estimate, cell_contrast, contrast, benjamini_hochberg, detectable, mark,
                        paired_contrast, pooled_accuracy_interval, seeds_needed, t_quantile, wilson_interval)


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


# What the hand-written formula gave before scipy computed the interval (fb1bb84): the same
# numbers to round-off (scipy arranges the formula differently, and returns 0 and 1 exactly at
# k = 0 and k = n where the old formula left ~1e-18).
WILSON_BEFORE_95 = {
    (0, 1): (0.0, 0.7934506856227626),
    (1, 1): (0.20654931437723745, 1.0),
    (0, 20): (0.0, 0.16112515805281938),
    (20, 20): (0.8388748419471806, 1.0),
    (8, 10): (0.4901624715366418, 0.9433178485456248),
    (4, 10): (0.16818032970623614, 0.6873262302663417),
    (500, 1000): (0.4690696003681042, 0.5309303996318958),
    (1, 3): (0.06149194472039615, 0.7923403991979523),
    (199, 200): (0.9722262956021069, 0.9991168312843989),
    (37, 40): (0.8013576647568946, 0.9741639742254119),
    (0, 300): (8.673617379884035e-19, 0.012642971224546034),
    (3, 7): (0.15821985525146975, 0.7495416354723428),
    (1, 2): (0.09453120573423074, 0.9054687942657693),
}
WILSON_BEFORE_90 = {  # z = 1.645: eval/tasks/borderline.py's one-sided 95% bounds
    (190, 200): (0.9181081670817905, 0.9698793883289112),
    (196, 200): (0.9561965428329557, 0.9909901829384595),
    (40, 40): (0.9366465513545421, 1.0),
    (187, 200): (0.9001271053783172, 0.9582608648520282),
    (180, 200): (0.8595933737545114, 0.9297288977216682),
    (96, 100): (0.9138471026288194, 0.98191759425066),
    (93, 100): (0.875739886933207, 0.9616053731932631),
    (0, 40): (0.0, 0.06335344864545805),
}


@pytest.mark.parametrize("level, before", [(0.95, WILSON_BEFORE_95), (0.90, WILSON_BEFORE_90)])
def test_wilson_interval_gives_the_numbers_of_the_formula_it_replaced(level, before):
    for (k, n), expected in before.items():
        assert wilson_interval(k, n, level=level) == pytest.approx(expected, abs=1e-12, rel=0), (k, n)
    assert wilson_interval(0, 7)[0] == 0.0 and wilson_interval(7, 7)[1] == 1.0


def _cell(nll, tokens, seeds=(0,)):
    nll = np.atleast_2d(np.asarray(nll, dtype=np.float64))
    return Cell(nll=nll, tokens=np.asarray(tokens, dtype=np.float64), runs=tuple(f"r{s}" for s in seeds),
                seeds=tuple(seeds))


def test_document_interval_is_the_ratio_estimators_by_hand():
    """One seed: mean NLL Σx/Σt with the delta-method SE of a ratio estimator over units
    (Cochran 1977, §6.4), t quantile on U − 1 df; no interval across training runs."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(50, 150, size=40).astype(np.float64)
    nll = tokens * rng.normal(4.0, 0.3, size=40)
    mean = nll.sum() / tokens.sum()
    se = math.sqrt(40 / 39 * (((nll - mean * tokens) / tokens.sum()) ** 2).sum())
    found = cell_contrast(_cell(nll, tokens))
    assert found.point == pytest.approx(mean, rel=1e-12)
    assert found.documents.se == pytest.approx(se, rel=1e-12) and found.documents.df == 39
    low, high = found.documents.interval()
    assert high - mean == pytest.approx(sps.t.ppf(0.975, 39) * se, rel=1e-12)
    assert found.runs is None and "one seed" in found.note


def test_seed_spread_widens_only_the_interval_across_runs():
    tokens = np.full(100, 100.0)
    base = np.random.default_rng(2).normal(400, 5, size=100)
    seeds = cell_contrast(_cell([base - 30, base, base + 30], tokens, seeds=(0, 1, 2)))
    assert seeds.point == pytest.approx(base.sum() / tokens.sum(), rel=1e-12)
    assert seeds.documents.se == pytest.approx(cell_contrast(_cell(base, tokens)).documents.se, rel=1e-12)
    # Seed part by hand: per-seed means differ by 0.3 nats: s² = 0.09, V = s²/3, plus the document part.
    v_seed, v_doc = 0.09 / 3, seeds.documents.variance
    assert seeds.runs.variance == pytest.approx(v_seed + v_doc, rel=1e-12)
    guard = v_seed * 2 / sps.chi2.ppf(0.25, 2)  # the seed part at its 75% upper bound, for the df only
    df = (guard + v_doc) ** 2 / (guard ** 2 / 2 + v_doc ** 2 / 99)  # Welch–Satterthwaite
    assert seeds.runs.df == pytest.approx(df, rel=1e-12)
    assert seeds.runs.interval()[1] - seeds.point == pytest.approx(sps.t.ppf(0.975, df) * math.sqrt(v_seed + v_doc))


def test_a_constant_shift_paired_by_seed_and_unit_is_exact():
    """b is a plus 0.01 nats on every token of every seed: both pairings cancel all noise."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(50, 150, size=60).astype(np.float64)
    a_nll = tokens * rng.normal(4.0, 0.5, size=(3, 60))
    a, b = _cell(a_nll, tokens, (0, 1, 2)), _cell(a_nll + 0.01 * tokens, tokens, (0, 1, 2))
    found = paired_contrast(b, a)
    assert found.point == pytest.approx(0.01)
    assert found.runs.se == pytest.approx(0, abs=1e-12) and found.runs.p_value < 1e-20
    assert found.runs.interval() == pytest.approx((0.01, 0.01))
    with pytest.raises(ValueError, match="same tokens"):
        paired_contrast(a, _cell(a_nll[:, :-1], tokens[:-1], (0, 1, 2)))


def test_rows_with_different_seeds_are_compared_unpaired():
    tokens = np.full(30, 100.0)
    base = np.random.default_rng(4).normal(400, 5, size=30)
    a = _cell([base + 10, base + 20, base + 30], tokens, (0, 1, 2))
    b = _cell([base, base + 40], tokens, (3, 4))
    found = paired_contrast(a, b)
    assert found.runs.pairing == "welch" and "different seeds" in found.note
    seed_parts = [p for p in found.runs.parts if p.per_seed is not None]
    assert sorted(p.variance for p in seed_parts) == pytest.approx(sorted([0.01 / 3, 0.08 / 2]))  # s²/S each
    one = paired_contrast(a, _cell([base], tokens, (0,)))
    assert one.runs is None  # a one-seed row has no seed variance to offer


# (p-values, adjusted) as the hand-written step-up procedure gave them before scipy's
# false_discovery_control replaced it (fb1bb84): ties, unsorted input, 0 and 1, one value.
BH_BEFORE = [
    ([0.04, 0.01, 0.02], [0.04, 0.03, 0.03]),
    ([0.01, 0.04, 0.01, 0.04, 0.2], [0.025, 0.05, 0.025, 0.05, 0.2]),
    ([0.3, 0.001, 0.049, 0.2, 0.012, 0.049, 0.7, 0.0004],
     [0.34285714285714286, 0.004, 0.0784, 0.26666666666666666, 0.032, 0.0784, 0.7, 0.0032]),
    ([1.0, 0.0, 0.5], [1.0, 0.0, 0.75]),
    ([0.3], [0.3]),
    ([0.04] * 5, [0.04] * 5),
    ([0.9, 0.8], [0.9, 0.9]),
    ([0.5, 0.001], [0.5, 0.002]),
    ([], []),
]


@pytest.mark.parametrize("p_values, before", BH_BEFORE)
def test_benjamini_hochberg_gives_the_numbers_of_the_procedure_it_replaced(p_values, before):
    # m·p/j against p·(m/j): the same product rounded in another order, a few ulps apart.
    assert benjamini_hochberg(p_values) == pytest.approx(before, abs=1e-15, rel=1e-15)


def test_benjamini_hochberg_by_hand():
    # p sorted .01, .02, .04 (m = 3): min over j ≥ i of 3·p(j)/j: .03, .03 (3·.02/2), .04.
    assert benjamini_hochberg([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.03])
    assert benjamini_hochberg([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert benjamini_hochberg([0.9, 0.8]) == pytest.approx([0.9, 0.9])  # monotone in p
    assert benjamini_hochberg([0.04] * 5) == pytest.approx([0.04] * 5)  # all marked at 5%, Holm would mark none
    assert mark(-0.1, 0.01) == "▼" and mark(0.1, 0.01) == "▲" and mark(0.1, 0.06) == "~" and mark(0.1, None) == ""


def test_power_by_hand():
    """A pure seed part s² = 0.0004 at S = 3 (documents identical): detectable difference
    (t.975 + t.80 on 2 df)·√(s²/3), and the seeds a given difference needs."""
    tokens = np.full(20, 100.0)
    base = np.full(20, 400.0)
    b = _cell([base, base, base], tokens, (0, 1, 2))
    a = _cell([base + 2, base + 4, base + 6], tokens, (0, 1, 2))  # per-seed differences .02, .04, .06
    est = paired_contrast(a, b).runs
    assert est.variance == pytest.approx(0.0004 / 3)
    factor = sps.t.ppf(0.975, 2) + sps.t.ppf(0.8, 2)
    assert detectable(est) == pytest.approx(factor * math.sqrt(0.0004 / 3))
    need = seeds_needed(est, 0.01)
    assert need is not None and need > 3
    for s in (need - 1, need):
        bound = (sps.t.ppf(0.975, s - 1) + sps.t.ppf(0.8, s - 1)) * math.sqrt(0.0004 / s)
        assert (bound <= 0.01) == (s == need)
    assert seeds_needed(est, 0.0) is None


def _simulate(rng, reps, seeds, units, sd_seed, sd_doc, sd_noise, delta):
    """(reps, 2 rows, seeds, units) NLL sums and tokens: row b = row a + delta + a seed
    effect + a document effect + noise, each row with shared seed and document effects."""
    tokens = rng.integers(50, 500, size=units).astype(np.float64)
    shape = (reps, seeds, units)
    seed_a = rng.normal(0, sd_seed, (reps, seeds, 1))
    doc_a = rng.normal(0, sd_doc, (reps, 1, units))
    rate_a = 4.0 + seed_a + doc_a + rng.normal(0, sd_noise, shape) * np.sqrt(100 / tokens)
    rate_b = (rate_a + delta + rng.normal(0, sd_seed, (reps, seeds, 1)) + rng.normal(0, sd_doc, (reps, 1, units))
              + rng.normal(0, sd_noise, shape) * np.sqrt(100 / tokens))
    return rate_a * tokens, rate_b * tokens, tokens


@pytest.mark.parametrize("seeds", [2, 3, 5, 10])  # 2: the core study's interim report
@pytest.mark.parametrize("regime", [(0.05, 0.005, 0.01), (0.003, 0.05, 0.01), (0.02, 0.02, 0.04)],
                         ids=["seed-dominated", "document-dominated", "mixed"])
def test_intervals_across_runs_cover_the_true_value(seeds, regime):
    """Known seed and document variances: the 95% interval across training runs covers the
    true mean (4.0) and the true paired difference (0.03) at least 93% of the time."""
    rng = np.random.default_rng(seeds * 100 + int(regime[0] * 1000))
    reps = 1500
    a, b, tokens = _simulate(rng, reps, seeds, 40, *regime, delta=0.03)
    ids = tuple(range(seeds))
    mean_hits = diff_hits = 0
    for r in range(reps):
        ca, cb = Cell(a[r], tokens, seeds=ids), Cell(b[r], tokens, seeds=ids)
        low, high = cell_contrast(ca).runs.interval()
        mean_hits += low <= 4.0 <= high
        low, high = paired_contrast(cb, ca).runs.interval()
        diff_hits += low <= 0.03 <= high
    assert mean_hits / reps >= 0.93 and diff_hits / reps >= 0.93


def _simulate_nested(rng, reps, parents, per_parent, units, sd_parent, sd_seed, sd_doc, delta):
    """(reps, 2 rows, parents·per_parent runs, units) NLL sums and tokens of fine-tunes: each
    run = a parent effect (shared by that parent's fine-tunes) + its own seed effect + a document
    effect + noise; row b = row a + delta + a parent-by-row effect + a seed-by-row effect."""
    tokens = rng.integers(50, 500, size=units).astype(np.float64)
    runs = parents * per_parent
    parent_of = np.arange(runs) % parents  # seed-major, as eval/reporting/tables.py orders rows
    doc = rng.normal(0, sd_doc, (reps, 1, units))
    noise = lambda: rng.normal(0, 0.01, (reps, runs, units)) * np.sqrt(100 / tokens)  # noqa: E731
    rate_a = (4.0 + rng.normal(0, sd_parent, (reps, parents, 1))[:, parent_of] + rng.normal(0, sd_seed, (reps, runs, 1))
              + doc + noise())
    rate_b = (rate_a + delta + rng.normal(0, sd_parent, (reps, parents, 1))[:, parent_of]
              + rng.normal(0, sd_seed, (reps, runs, 1)) + noise())
    names = tuple(f"parent-{i}" for i in parent_of)
    seeds = tuple(int(k) for k in np.arange(runs) // parents)
    return rate_a * tokens, rate_b * tokens, tokens, names, seeds


@pytest.mark.parametrize("parents, per_parent", [(3, 2), (5, 2)])  # 3 x 2: the retrieval fine-tune grid
def test_fine_tunes_of_several_parents_count_each_parent_once(parents, per_parent):
    """Parents that differ much more than their fine-tunes: intervals from the parents' means
    cover the true mean and paired difference ≥ 93% of the time; counting every fine-tune as
    an independent run (no units) covers the mean far less often."""
    rng = np.random.default_rng(parents * 10 + per_parent)
    reps = 1500
    a, b, tokens, units, seeds = _simulate_nested(rng, reps, parents, per_parent, 40, sd_parent=0.05,
                                                  sd_seed=0.005, sd_doc=0.005, delta=0.03)
    hits = {"mean": 0, "diff": 0, "naive": 0}
    for r in range(reps):
        ca, cb = Cell(a[r], tokens, seeds=seeds, units=units), Cell(b[r], tokens, seeds=seeds, units=units)
        low, high = cell_contrast(ca).runs.interval()
        hits["mean"] += low <= 4.0 <= high
        low, high = paired_contrast(cb, ca).runs.interval()
        hits["diff"] += low <= 0.03 <= high
        low, high = cell_contrast(Cell(a[r], tokens, seeds=seeds)).runs.interval()
        hits["naive"] += low <= 4.0 <= high
    assert hits["mean"] / reps >= 0.93 and hits["diff"] / reps >= 0.93
    assert hits["naive"] / reps < 0.88
    found = cell_contrast(ca).runs
    assert found.seeds == parents and found.df < parents  # the parents are the replicates


def test_units_by_hand():
    """Parents' means first: 3 parents x 2 fine-tunes; the seed part is the spread of the 3
    parent means over 3 on 2 df, and one parent alone keeps its fine-tunes as the units."""
    tokens = np.full(4, 10.0)
    per_run = np.array([1.0, 2.0, 4.0, 1.2, 2.2, 4.2])  # runs: parents 0, 1, 2 (seed 0), then (seed 1)
    units = ("p0", "p1", "p2", "p0", "p1", "p2")
    cell = Cell(np.outer(per_run, tokens), tokens, seeds=(0, 0, 0, 1, 1, 1), units=units)
    found = cell_contrast(cell)
    means = np.array([1.1, 2.1, 4.1])
    assert found.point == pytest.approx(means.mean())
    seed_part = found.runs.parts[0]
    assert seed_part.variance == pytest.approx(np.var(means, ddof=1) / 3) and seed_part.df == 2
    unbalanced = Cell(np.outer(per_run[:5], tokens), tokens, units=units[:5])  # p2 has one fine-tune
    assert cell_contrast(unbalanced).point == pytest.approx((1.1 + 2.1 + 4.0) / 3)
    alone = cell_contrast(Cell(np.outer(per_run[:2], tokens), tokens, units=("p0", "p0"))).runs.parts[0]
    assert alone.df == 1 and alone.variance == pytest.approx(np.var([1.0, 2.0], ddof=1) / 2)
    # Accuracies: seeds of a parent that agree do not make their parent count twice.
    est = accuracy_estimate([(90, 100), (90, 100), (10, 100), (10, 100)], units=("p0", "p0", "p1", "p1"))
    assert est.parts[0].df == 1 and est.parts[0].variance == pytest.approx(np.var([0.9, 0.1], ddof=1) / 2)


def test_a_percentile_bootstrap_over_three_seeds_undercovers():
    """Why the method changed: resampling 3 seeds with replacement (seed variance only)
    covers the true mean far less often than 95%; the t-interval does not."""
    rng = np.random.default_rng(7)
    values = rng.normal(0.0, 1.0, size=(2000, 3))
    boot = values[:, rng.integers(0, 3, size=(400, 3))].mean(axis=2)  # (2000, 400)
    low, high = np.percentile(boot, [2.5, 97.5], axis=1)
    assert np.mean((low <= 0) & (0 <= high)) < 0.85
    half = sps.t.ppf(0.975, 2) * values.std(axis=1, ddof=1) / math.sqrt(3)
    assert np.mean(np.abs(values.mean(axis=1)) <= half) >= 0.94


def test_contrast_of_ratios_pairs_lengths_by_seed():
    """ppl(kL)/ppl(L) per seed, then its difference from the reference's: exact for
    constant per-seed shifts (different units at the two lengths add document variance)."""
    rng = np.random.default_rng(8)
    t1, t2 = np.full(25, 100.0), np.full(30, 80.0)
    a1 = t1 * rng.normal(4.0, 0.2, size=(3, 25))
    a2 = t2 * rng.normal(4.2, 0.2, size=(3, 30))
    at_l, at_kl = _cell(a1, t1, (0, 1, 2)), _cell(a2, t2, (0, 1, 2))
    ratio = contrast([(1.0, at_kl), (-1.0, at_l)])
    assert ratio.point == pytest.approx((a2.sum(1) / t2.sum() - a1.sum(1) / t1.sum()).mean())
    assert len(ratio.documents.parts) == 2  # two sets of units, independent
    ref_l, ref_kl = _cell(a1 - 0.1 * t1, t1, (0, 1, 2)), _cell(a2 + 0.05 * t2, t2, (0, 1, 2))
    diff = contrast([(1.0, at_kl), (-1.0, at_l), (-1.0, ref_kl), (1.0, ref_l)])
    assert diff.point == pytest.approx(-0.15) and diff.runs.se == pytest.approx(0, abs=1e-12)


def test_a_pooled_accuracy_interval_counts_seeds_that_disagree():
    # One seed learned the task, two did not: 0.33 pooled, which ±0.05 (Wilson on 300
    # instances) would misstate; with three seeds the mean could be anywhere in [0, 1].
    low, high = pooled_accuracy_interval([(100, 100), (0, 100), (0, 100)])
    assert (low, high) == (0.0, 1.0)
    # By hand: per-seed .5, .6, .7: s² = .01, V = .01/3 + .6·.4/100, df Satterthwaite.
    est = accuracy_estimate([(50, 100), (60, 100), (70, 100)])
    v1, v2 = 0.01 / 3, 0.24 / 100
    assert est.variance == pytest.approx(v1 + v2)
    g1 = v1 * 2 / sps.chi2.ppf(0.25, 2)
    assert est.df == pytest.approx((g1 + v2) ** 2 / (g1 ** 2 / 2 + v2 ** 2 / 99))
    # Seeds that agree: the instances decide, and it is never narrower than Wilson.
    low, high = pooled_accuracy_interval([(50, 100), (50, 100), (50, 100)])
    wilson = wilson_interval(150, 300)
    assert low <= wilson[0] and high >= wilson[1]
    # All wrong: not a point at 0, the Wilson upper bound.
    low, high = pooled_accuracy_interval([(0, 100)] * 3)
    assert low == 0.0 and high == wilson_interval(0, 300)[1] > 0.01
    assert pooled_accuracy_interval([(30, 100)]) == wilson_interval(30, 100)  # one seed


def test_t_quantiles_are_the_tables():
    # The 97.5% points of Student's t, two-sided 95% (any statistics table).
    for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262), (10, 2.228), (30, 2.042)):
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-3)
    assert t_quantile(0.975, 100_000) == pytest.approx(1.95996, abs=1e-4)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)


def test_the_normal_quantile_literal_is_scipys_to_the_last_digit():
    from ropelab.eval.reporting.stats import Z95

    assert Z95 == float(sps.norm.ppf(0.975))  # a literal only so that importing eval.stats skips scipy.stats


def test_a_heavy_tailed_cell_shows_every_seeds_value_beside_its_interval():
    """NoPE's perplexity at 16L in the core study: an interval of 5.7–528,144 hides that its seeds
    disagree by orders of magnitude, so the cell lists them; a narrow interval does not."""
    from types import SimpleNamespace

    from ropelab.eval.reporting.tables import heavy, ppl_text, seeds_text
    assert heavy(0.307, 27_889) and not heavy(0.945, 0.953) and not heavy(0.0, 1.0)
    assert seeds_text([4.3, 4.3, 11.5, 142, 228_980], "×") == "; seeds ×4.3, ×4.3, ×11.5, ×142, ×228,980"
    seeds = SimpleNamespace(seed_values=lambda: np.log([30.0, 31.0, 90.0, 2_600.0, 4.1e6]))
    wide = {"ppl": 1735.0, "low": 5.7, "high": 528_144.0, "interval": "runs", "cell": seeds}
    assert ppl_text(wide).endswith("; seeds 30, 31, 90, 2,600, 4,100,000")
    narrow = {**wide, "ppl": 15.0, "low": 14.3, "high": 15.7}
    assert "seeds" not in ppl_text(narrow)
