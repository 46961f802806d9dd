"""Task accuracies compared with the reference row (eval/tasks/compare.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ropelab.eval.reporting.stats import t_quantile
from ropelab.eval.reporting.labels import budget_partner
from ropelab.eval.tasks.compare import accuracy_difference
from ropelab.eval.tasks.report import write_task_report


def meta(runs: dict[str, tuple[int, str | None]]) -> dict[str, dict]:
    """run -> a record with its seed and, for a fine-tune, its parent."""
    return {run: {"run": run, "seed": seed, **({"parent": {"run": parent, "checkpoint": "step_9"}} if parent else {})}
            for run, (seed, parent) in runs.items()}


def agresti_caffo(p: float, n: int) -> float:
    q = (p * n + 1) / (n + 2)
    return q * (1 - q) / (n + 2)


def agresti_min(d: np.ndarray) -> float:
    """The variance of a mean paired difference with half a pseudo-pair of each kind added."""
    m = len(d) + 2
    return ((np.sum(d * d) + 1) / m - (np.sum(d) / m) ** 2) / m


def test_paired_difference_by_hand():
    """Three seeds each of two rows with the same seeds: the seed part is the spread of the
    per-seed differences (2 df), the instance part both rows' Agresti–Caffo binomial variances."""
    a = {"a0": (36, 40), "a1": (20, 40), "a2": (8, 40)}
    b = {"b0": (30, 40), "b1": (16, 40), "b2": (2, 40)}
    m = meta({"a0": (0, None), "a1": (1, None), "a2": (2, None), "b0": (0, None), "b1": (1, None), "b2": (2, None)})
    found = accuracy_difference(a, b, m)
    d = np.array([6, 4, 6]) / 40
    assert found.pairing == "seed" and found.seeds == 3
    assert found.point == pytest.approx(d.mean())
    seed, instances = found.parts
    assert seed.variance == pytest.approx(np.var(d, ddof=1) / 3) and seed.df == 2
    assert instances.variance == pytest.approx(agresti_caffo(64 / 120, 40) + agresti_caffo(48 / 120, 40))
    assert instances.df == 39
    low, high = found.interval()
    assert high - low == pytest.approx(2 * t_quantile(0.975, found.df) * found.se)
    # The seeds move together (0.9, 0.5, 0.2 against 0.75, 0.4, 0.05): unpaired, their spread
    # would swamp the difference; paired, it is the difference's spread alone.
    unpaired = accuracy_difference(a, {"c0": b["b0"], "c1": b["b1"], "c2": b["b2"]},
                                   {**m, **meta({"c0": (5, None), "c1": (6, None), "c2": (7, None)})})
    assert unpaired.pairing == "welch" and unpaired.point == pytest.approx(found.point)
    assert unpaired.parts[0].variance + unpaired.parts[1].variance > 100 * found.parts[0].variance


def test_kept_outcomes_give_the_paired_instance_part():
    """Where the cells keep each instance's outcome (copy, addition), the instance part is the
    spread over instances of the paired difference: rows of which one answers a superset of the
    other's instances differ by a few discordant ones, far less than the binomial bound says."""
    n = 40
    right_b = np.zeros(n)
    right_b[:16] = 1
    right_a = right_b.copy()
    right_a[16:21] = 1  # 5 more instances right, the same 16 too
    runs = {f"{row}{k}": (k, None) for row in "ab" for k in range(3)}
    a = {f"a{k}": (21, n, right_a) for k in range(3)}
    b = {f"b{k}": (16, n, right_b) for k in range(3)}
    found = accuracy_difference(a, b, meta(runs))
    assert found.point == pytest.approx(5 / 40) and found.parts[0].variance == 0  # every seed alike
    # Agresti & Min's adjusted Wald variance for matched pairs: 5 discordant pairs (a right, b
    # wrong), none the other way, half a pseudo-pair of each kind added
    p12, p21 = (5 + 0.5) / (n + 2), (0 + 0.5) / (n + 2)
    assert found.parts[1].variance == pytest.approx(((p12 + p21) - (p12 - p21) ** 2) / (n + 2))
    assert found.parts[1].df == n - 1
    bound = accuracy_difference({k: v[:2] for k, v in a.items()}, {k: v[:2] for k, v in b.items()}, meta(runs))
    assert bound.parts[1].variance == pytest.approx(agresti_caffo(21 / 40, n) + agresti_caffo(16 / 40, n))
    assert found.interval()[0] > 0 > bound.interval()[0]


def test_rows_that_agree_on_every_instance_keep_an_interval():
    """Two rows wrong on all 40 instances (both 0.00 far beyond L), or right on all: the
    paired differences are all 0, yet 40 instances cannot rule out a difference of a few
    points, so the interval is not [0, 0] (Agresti & Min 2005: variance 1/(n + 2)^2)."""
    n = 40
    runs = {f"{row}{k}": (k, None) for row in "ab" for k in range(3)}
    for outcome in (0.0, 1.0):
        right = np.full(n, outcome)
        found = accuracy_difference({f"a{k}": (int(right.sum()), n, right) for k in range(3)},
                                    {f"b{k}": (int(right.sum()), n, right) for k in range(3)}, meta(runs))
        assert found.point == 0 and found.parts[1].variance == pytest.approx(1 / (n + 2) ** 2)
        low, high = found.interval()
        assert low == pytest.approx(-high) and 0.03 < high < 0.06
        assert found.p_value == pytest.approx(1.0)


def test_fine_tunes_pair_by_parent_and_seed_and_count_each_parent_once():
    """Two parents × two fine-tuning seeds per row: the differences are averaged within each
    parent first, so the seed part is over 2 parents (1 df), not 4 runs."""
    runs = {f"{row}{p}{s}": (s, f"p{p}") for row in "ab" for p in (0, 1) for s in (0, 1)}
    a = {"a00": (20, 20), "a01": (18, 20), "a10": (10, 20), "a11": (12, 20)}
    b = {"b00": (10, 20), "b01": (10, 20), "b10": (10, 20), "b11": (8, 20)}
    found = accuracy_difference(a, b, meta(runs))
    parents = np.array([(10 + 8) / 2, (0 + 4) / 2]) / 20
    assert found.pairing == "seed" and found.seeds == 2
    assert found.point == pytest.approx(parents.mean())
    assert found.parts[0].variance == pytest.approx(np.var(parents, ddof=1) / 2) and found.parts[0].df == 1


def test_rows_whose_pooled_seeds_differ_are_compared_unpaired_and_one_seed_has_no_test():
    m = meta({"a0": (0, None), "a1": (1, None), "a2": (2, None), "b0": (0, None), "b1": (1, None)})
    found = accuracy_difference({"a0": (10, 10), "a1": (9, 10), "a2": (10, 10)}, {"b0": (5, 10), "b1": (7, 10)}, m)
    assert found.pairing == "welch" and found.seeds == 2 and len(found.parts) == 3
    assert found.parts[0].variance == pytest.approx(np.var([1.0, 0.9, 1.0], ddof=1) / 3)
    assert found.parts[1].variance == pytest.approx(np.var([0.5, 0.7], ddof=1) / 2)
    single = accuracy_difference({"a0": (10, 10)}, {"b0": (5, 10)}, m)
    assert all(p.per_seed is None for p in single.parts)  # no spread across training runs to test with
    assert accuracy_difference({}, {"b0": (5, 10)}, m) is None


def test_budget_rows_are_compared_with_the_reference_after_as_many_steps():
    assert budget_partner("yarn @ 50", "none @ 400") == "none @ 50"
    assert budget_partner("none @ 50", "none @ 400") == "none @ 400"  # the reference's own checkpoints
    assert budget_partner("alibi", "rope") == "rope"


# (logit of row a, of row b, sd of the seed effect both rows share, of the seed-by-row
# interaction, of the instances' difficulty, instances, seeds)
REGIMES = {"seeds-dominate": (0.8, 0.2, 1.0, 1.0, 1.0, 40, 3),
           # the instances drawn decide most of the difference: without the instance part the
           # interval covers ~83% here
           "instances-dominate": (3.0, 0.0, 0.5, 0.0, 4.0, 20, 5)}


@pytest.mark.parametrize("outcomes", [False, True])
@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_paired_interval_covers_the_true_difference(regime, outcomes):
    """Simulated rows answering the same instances with the same seeds: a seed effect both rows
    share (pairing), a seed-by-row interaction, an instance difficulty all share, Bernoulli
    answers. The 95% interval, from counts alone or from each instance's outcome, covers the
    true difference of accuracy probabilities at least 93% of the time."""
    rng = np.random.default_rng(0)
    alpha_a, alpha_b, seed_sd, row_sd, instance_sd, n, seeds = REGIMES[regime]

    def p(alpha, u, v):
        return 1 / (1 + np.exp(-(alpha + u + v)))

    big_u, big_w, big_v = rng.normal(0, seed_sd, (2, 4000, 1)), rng.normal(0, row_sd, (4000, 1)), rng.normal(
        0, instance_sd, (1, 4000))
    truth = float((p(alpha_a, big_u[0] + big_w, big_v) - p(alpha_b, big_u[0], big_v)).mean())
    m = meta({**{f"a{k}": (k, None) for k in range(seeds)}, **{f"b{k}": (k, None) for k in range(seeds)}})
    covered, trials = 0, 400
    for _ in range(trials):
        u, w, v = rng.normal(0, seed_sd, (seeds, 1)), rng.normal(0, row_sd, (seeds, 1)), rng.normal(0, instance_sd,
                                                                                                 (1, n))
        right = {"a": rng.random((seeds, n)) < p(alpha_a, u + w, v), "b": rng.random((seeds, n)) < p(alpha_b, u, v)}
        sides = [{f"{row}{k}": (int(right[row][k].sum()), n) + ((right[row][k].astype(float),) if outcomes else ())
                  for k in range(seeds)} for row in "ab"]
        low, high = accuracy_difference(*sides, m).interval()
        covered += low <= truth <= high
    assert covered / trials >= 0.93


def run_record(run: str, seed: int, stem: str, encoding: str = "rope", reference: str = "rope", parent=None) -> dict:
    return {"run": run, "name": run, "encoding": encoding, "group": stem, "stem": stem, "seed": seed, "params": 1,
            "tokens_trained": 1, "train_len": 32, "git_commit": "abc", "tasks_trained": ["copy"],
            "eval": {"reference": reference, "tasks": {"learned_accuracy": None if parent else 0.95}},
            **({"parent": {"run": parent, "checkpoint": "step_9"}} if parent else {})}


def cell(run: str, seed: int, length: int, correct: int, total: int = 40, **extra) -> dict:
    return {"run": run, "name": run, "encoding": "rope", "seed": seed, "train_len": 32, "task": "copy",
            "scaling": "none", "length": length, "depth": None, "status": "ok", "correct": correct, "total": total,
            "accuracy": correct / total, "ci_low": 0.0, "ci_high": 1.0, **extra}


def test_a_task_report_compares_every_row_with_the_reference(tmp_path):
    """Encodings against eval.reference (rope) over their learned seeds: ALiBi learned at 3
    seeds like RoPE (paired), NoPE at 2 of 3 (unpaired, over its 2)."""
    runs = [run_record(f"{e}{s}", s, e, encoding=e) for e in ("rope", "alibi", "nope") for s in range(3)]
    at = {"rope": [(40, 10), (39, 12), (40, 8)], "alibi": [(40, 38), (40, 36), (39, 39)],
          "nope": [(40, 2), (39, 0), (10, 0)]}
    rows = [{**cell(f"{e}{s}", s, n, c), "encoding": e} for e, seeds in at.items()
            for s, counts in enumerate(seeds) for n, c in zip((32, 64), counts)]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "Compared with `rope`" in report and "unpaired (Welch), as their pooled seeds differ: `nope vs rope`" in report
    line = next(x for x in report.splitlines() if x.startswith("| alibi vs rope |"))
    assert line.endswith("▲ |") and "+0.69 [" in line  # (38 + 36 + 39 − 10 − 12 − 8) / 120 at 64
    assert next(x for x in report.splitlines() if x.startswith("| nope vs rope |")).count("[") == 2
    assert "Not compared" not in report
    assert "correction over this table's 4 tests." in report  # every run in: the family is whole
    # A grid with runs still missing says that its family (and so a mark) may grow.
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [],
                       "missing": [{"run": "runs/g/xpos0", "error": "not finished"}]}, tmp_path / "partial")
    partial = (tmp_path / "partial" / "report.md").read_text()
    assert "correction over this table's 4 tests of the runs in so far (1 run listed as missing" in partial
    # The same report made again from its results.json against another row: ALiBi's.
    from ropelab.eval.regenerate import main as remake
    (tmp_path / "results.json").write_text(json.dumps({"created": "now", "runs": runs, "results": rows, "kmax": [],
                                                       "missing": []}))
    assert remake([str(tmp_path / "results.json"), "--reference", "alibi", "--out", str(tmp_path / "vs-alibi")]) == 0
    again = (tmp_path / "vs-alibi" / "report.md").read_text()
    assert "Compared with `alibi`" in again and "| alibi vs rope |" not in again
    assert next(x for x in again.splitlines() if x.startswith("| rope vs alibi |")).endswith("▼ |")
    assert remake([str(tmp_path / "results.json"), "--reference", "xpos", "--out", str(tmp_path / "vs-xpos")]) == 0
    assert "eval.reference names no row of this task" in (tmp_path / "vs-xpos" / "report.md").read_text()
    # Power: the smallest difference each comparison detects, and the seeds the observed one needs.
    from ropelab.eval.reporting.stats import detectable, seeds_needed
    from ropelab.eval.tasks.compare import task_comparisons
    from ropelab.eval.tasks.report import label_rows, pooled_seeds
    kept = pooled_seeds(runs, rows, "copy")[0]
    found = task_comparisons(kept, "rope", {r["run"]: r for r in runs})["alibi vs rope"][64]["estimate"]
    power = [x for x in report.splitlines() if x.startswith("| alibi vs rope |")][1]
    assert f"±{detectable(found):.2f} · {seeds_needed(found, found.point)} |" in power
    assert label_rows(runs, rows)["rope0"] == "rope"


def test_a_budget_report_names_the_reference_as_the_perplexity_report_does(tmp_path):
    """eval.reference "none @ 400" (a perplexity-report row: one encoding, rows named by stem) is
    the task report's "rope [none] @ 400"; yarn @ 0 is compared with none @ 0, paired by parent."""
    runs = [run_record(f"{stem}{p}{s}", s, stem, reference="none @ 400", parent=f"p{p}")
            for stem in ("none", "yarn") for p in (0, 1, 2) for s in (0, 1)]
    rows = [{**cell(r["run"], r["seed"], 64, c), "eval_step": step} for r in runs for step in (0, 400)
            for c in [(30 if r["stem"] == "yarn" else 10) + int(r["run"][-2])]]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "Compared with `rope [none] @ 400`" in report
    assert "| rope [yarn] @ 0 vs rope [none] @ 0 | +0.50 [" in report  # (30 − 10) / 40 at every parent
    assert "| rope [none] @ 0 vs rope [none] @ 400 |" in report
    assert "Compared with the reference row: none" not in report


def test_cells_outcome_strings_pair_instances_across_depths():
    """Passkey cells keep "outcomes" per depth: a run's instances are its depth cells in depth
    order (whatever order its rows came in), and the instance part is their paired difference's
    spread."""
    from ropelab.eval.tasks.compare import task_comparisons
    outcomes = {"a": {0.0: "1111", 1.0: "1100"}, "b": {0.0: "1110", 1.0: "1000"}}
    kept = {row: {f"{row}{k}": {64: [{"status": "ok", "depth": d, "correct": o.count("1"), "total": 4, "outcomes": o}
                                     for d, o in sorted(outcomes[row].items(), reverse=row == "a")]} for k in range(2)}
            for row in "ab"}
    m = meta({f"{row}{k}": (k, None) for row in "ab" for k in range(2)})
    found = task_comparisons(kept, "b", m)["a vs b"][64]["estimate"]
    d = np.array([1, 1, 1, 1, 1, 1, 0, 0]) - np.array([1, 1, 1, 0, 1, 0, 0, 0])
    assert found.point == pytest.approx(2 / 8) and found.parts[1].variance == pytest.approx(agresti_min(d))


def test_a_grid_with_a_model_per_task_compares_within_each_task(tmp_path):
    """rope and alibi each train one model per task (stems "rope_copy", "rope_recall"...): the
    reference "rope" is the RoPE row of each task's table, not a row no table has."""
    runs, rows = [], []
    for e in ("rope", "alibi"):
        for task in ("copy", "recall"):
            for s in range(2):
                run = f"{e}_{task}{s}"
                runs.append({**run_record(run, s, f"{e}_{task}", encoding=e), "tasks_trained": [task],
                             "group": f"{e}-{task}"})
                rows += [{**cell(run, s, n, c), "encoding": e, "task": task}
                         for n, c in ((32, 40), (64, 30 if e == "alibi" else 5 + s))]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert report.count("Compared with `rope`") == 2 and "names no row" not in report
    assert report.count("| alibi vs rope |") == 4  # a difference and a power row per task


def test_a_reference_row_no_seed_of_which_learned_the_task_says_so(tmp_path):
    runs = [run_record(f"{e}{s}", s, e, encoding=e) for e in ("rope", "alibi") for s in range(2)]
    rows = [{**cell(f"{e}{s}", s, n, c), "encoding": e} for e in ("rope", "alibi") for s in range(2)
            for n, c in ((32, 40 if e == "alibi" else 10), (64, 20))]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    assert "Compared with `rope`: none; no seed of it learned the task." in (tmp_path / "report.md").read_text()
    # The other way round: the row that learned nothing is named, not silently left out.
    rows = [{**r, "correct": 40 if r["encoding"] == "rope" and r["length"] == 32 else r["correct"] if
             r["encoding"] == "rope" else 10} for r in rows]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "Compared with `rope`: none; no seed of the other rows learned the task (`alibi`)." in report
    # Beside a row that is compared, one that learned nothing is named under the table's sentence.
    runs += [run_record(f"nope{s}", s, "nope", encoding="nope") for s in range(2)]
    rows += [{**cell(f"nope{s}", s, n, c), "encoding": "nope"} for s in range(2) for n, c in ((32, 40), (64, 5))]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "Not compared, as no seed of theirs learned the task: `alibi`." in report and "| nope vs rope |" in report


def test_a_difference_that_rounds_to_zero_keeps_its_sign_and_a_digit():
    from ropelab.eval.tasks.compare import signed
    assert [signed(x) for x in (-0.003, 0.004, 0.0, -0.12, 0.005)] == ["-0.003", "+0.004", "+0.00", "-0.12", "+0.01"]
    assert [signed(x) for x in (-0.0003, 0.00004)] == ["-0.0003", "+4e-05"]  # not -0.000
    noise = (0.1 + 0.2) - 0.3  # 5.6e-17: equal accuracies summed in another order
    assert [signed(noise), signed(-noise)] == ["+0.00", "+0.00"]  # not +6e-17


def test_a_comparison_with_one_seed_on_a_side_claims_no_test_and_no_power(tmp_path):
    """RoPE learned the task at one seed of three, sinusoidal at three: the difference is shown,
    marked (one seed), and the section says no test across training runs was made instead of
    speaking of a correction over 0 tests, with no power table of dashes."""
    runs = [run_record(f"{e}{s}", s, e, encoding=e) for e in ("rope", "sinusoidal") for s in range(3)]
    rows = [{**cell(f"{e}{s}", s, n, c), "encoding": e} for e in ("rope", "sinusoidal") for s in range(3)
            for n, c in ((32, 40 if e == "sinusoidal" or s == 2 else 3), (64, 30 if e == "sinusoidal" else 10))]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "| sinusoidal vs rope | +0.00 (one seed) | +0.50 (one seed) |" in report
    assert "No test across training runs" in report and "over this table's 0 tests" not in report
    assert "Power across training runs" not in report


def test_cells_at_the_floor_or_ceiling_are_no_test_and_stay_out_of_the_family(tmp_path):
    """RoPE and ALiBi both answer every copy instance right at 32 (the ceiling) and every one wrong
    at 128 (the floor): no outcome of those cells could differ, so they are printed as no test and
    the Benjamini–Hochberg family holds only the comparison at 64. The summary opens the report
    with the accuracy table and one sentence per finding, read off the same marks."""
    runs = [run_record(f"{e}{s}", s, e, encoding=e) for e in ("rope", "alibi") for s in range(3)]
    at = {"rope": [(40, 2, 0), (40, 1, 0), (40, 3, 0)], "alibi": [(40, 38, 0), (40, 36, 0), (40, 39, 0)]}
    rows = [{**cell(f"{e}{s}", s, n, c), "encoding": e} for e, seeds in at.items()
            for s, counts in enumerate(seeds) for n, c in zip((32, 64, 128), counts)]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    line = next(x for x in report.splitlines() if x.startswith("| alibi vs rope |"))
    assert line.count("ceiling: no test") == 1 and line.count("floor: no test") == 1 and line.count("▲") == 1
    assert "correction over this table's 1 test; 2 comparisons where both rows are at the floor" in report
    summary = report.split("## Summary", 1)[1].split("## How to read this report", 1)[0]
    assert "- copy, against `rope` after the correction: higher accuracy: `alibi` (2L)." in summary
    assert report.index("## Summary") < report.index("## Runs")


def test_rows_trained_unalike_are_said_to_differ_above_the_comparison():
    """Rows trained for other budgets differ in more than their encoding: the task report says
    so above its comparison, as the perplexity report does (eval/reporting/like_for_like.py)."""
    from ropelab.eval.tasks.compare import comparison_section

    def cells(correct: int) -> list[dict]:
        return [{"status": "ok", "correct": correct, "total": 10, "depth": None}]

    kept = {"rope": {"r0": {32: cells(9)}, "r1": {32: cells(8)}}, "alibi": {"a0": {32: cells(5)}, "a1": {32: cells(6)}}}
    records = meta({"r0": (0, None), "r1": (1, None), "a0": (0, None), "a1": (1, None)})
    for run, record in records.items():
        steps = 600 if run.startswith("r") else 200
        record.update(steps=steps, tokens_trained=2048 * steps)
    lines = comparison_section(kept, "rope", records, [32], {"rope": 32, "alibi": 32}, lambda n, length: "")
    text = "\n".join(lines)
    note = "`alibi` against `rope`: steps (200 against 600), tokens trained (409,600 against 1,228,800)"
    assert note in text and text.index(note) < text.index("Compared with `rope`: the first row's accuracy")
    for record in records.values():
        record.update(steps=600, tokens_trained=1_228_800)
    assert "Not like for like" not in "\n".join(
        comparison_section(kept, "rope", records, [32], {"rope": 32, "alibi": 32}, lambda n, length: ""))
