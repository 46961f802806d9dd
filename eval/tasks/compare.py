"""Task accuracies compared with the reference row, across training runs.

A task table says each row's accuracy with its interval; two rows whose intervals overlap
may still differ, and rows whose seeds move together (fine-tunes of the same parents, a
checkpoint against a later one of the same runs) are compared far more sharply by their
per-seed differences. So each task section adds, for every row, its accuracy minus the
reference row's (eval.reference, the row the perplexity report compares every other with;
in a budget grid, the reference row after as many fine-tuning steps, and the reference's own
checkpoints against its named step, as eval/lm/report.py pairs them), at every length both
rows scored, over the seeds each row pools (those that learned the task, or every seed
where learning is not judged).

The estimate is eval/reporting/stats.py's ``accuracy_estimate`` made a difference:

- **Seed part.** Where both rows pool runs of the same seeds (and, for fine-tunes, the same
  parents), the difference is formed seed by seed, averaged within a parent where
  fine-tunes share one, and its spread over the S seeds (C parents) gives s²/S on S − 1
  (C − 1) degrees of freedom. Otherwise (rows whose learned seeds differ) each row's
  per-seed accuracies give their own s²/S (Welch). A row with one seed (parent) gives no
  interval across training runs.
- **Instance part.** Every row answers the same n instances (eval.tasks.seed), so which
  instances were drawn moves both. Where the cells keep each instance's outcome
  (``first_error`` against ``answer_tokens``; ``outcomes`` in retrieval cells scored before
  every task kept first errors), it is the variance over instances of the paired difference
  d of the rows' seed-averaged outcomes, with Agresti & Min's (2005) adjustment for matched
  pairs: half a pseudo-pair each of (right, wrong), (wrong, right), (right, right) and
  (wrong, wrong), i.e. d = +1 and d = −1 with weight ½ each and d = 0 with weight 1, so
  (Σd² + 1)/(n + 2) − (Σd/(n + 2))², /(n + 2), on n − 1 degrees of freedom (for one seed a
  side, their adjusted Wald variance [(p₁₂ + p₂₁) − (p₁₂ − p₂₁)²]/(n + 2)). Unadjusted, rows
  that agree on every instance (both 0.00 far beyond L, both 1.00 at L) had a variance of 0
  and an interval of [+0.00, +0.00]; adjusted, the interval says what n instances can and
  cannot rule out (0/40 against 0/40: ±0.05). Where they keep counts
  alone, it is bounded by the sum of the two rows' binomial variances, each with one success
  and one failure added (p̃ = (np̄ + 1)/(n + 2), p̃(1 − p̃)/(n + 2); Agresti & Caffo 2000), on
  n − 1 degrees of freedom: never zero at 0 or n correct, and wide where the rows fail on
  the same instances (a row that answers a superset of another's instances differs by few
  discordant ones, which the bound cannot see). Cells scored before they kept outcomes have
  counts alone.

The interval is the t-interval with Satterthwaite's degrees of freedom of the sum (guarded
as eval/reporting/stats.py's ``satterthwaite``); marks (▲ higher accuracy than the row compared with,
▼ lower, ~ neither) follow the Benjamini–Hochberg correction over the task's table, as the
perplexity report's do.

**Which comparisons form one correction family.** One task's table of comparisons with the
reference row is one family: every row against the reference at every length both scored,
the tests across training runs only (a comparison with one seed a side is no test). A
comparison where both rows answered every instance wrong (the floor: no seed of either row
correct on any instance) or every instance right (the ceiling) is not a test either: given
its margins (no success, or no failure, anywhere in the pair) no outcome could differ, its
smallest attainable p-value is 1, and counting it would only lower every other test's
threshold (Tarone 1990, "A modified Bonferroni method for discrete data", Biometrics 46:515–522,
leaves out of the multiplicity count the tests that cannot reach significance; we apply that
idea, for these cells only, to the Benjamini–Hochberg family). It prints its difference, +0.00, marked "floor" or "ceiling", and the marks sentence
says how many such cells the table has.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ropelab.eval.reporting.labels import budget_partner, label_groups, label_order, replicate_unit, split_step
from ropelab.eval.reporting.reference import DEFAULT_REFERENCE
from ropelab.eval.reporting.stats import Estimate, Part, benjamini_hochberg, detectable, mark, seeds_needed, unit_means
from ropelab.eval.reporting.like_for_like import unlike_note
from ropelab.eval.reporting.tables import length_table

RunCells = dict[str, dict[int, list[dict]]]  # run -> length -> its cells (one per depth)


def task_reference(runs: list[dict], task_labels: dict[str, str]) -> Optional[str]:
    """The reference row (eval.reference, named as the perplexity report names rows) in the task
    report's names (``task_labels``: run -> its label there), or None where no run is that row.

    The perplexity report names a row by its encoding, or by its run-name stem where one
    encoding has several experiments ("none @ 400"); the task report by its encoding with the
    stem in brackets ("rope [none] @ 400"). Both name the rows of one task's table among that
    task's runs alone, so in a grid with a model per task "rope" is each task's RoPE row."""
    asked = next((run["eval"].get("reference") for run in runs if run.get("eval")), None) or DEFAULT_REFERENCE
    head, step = split_step(asked)
    row, plus, scaling = head.partition(" + ")
    named = [dict(run) for run in runs if run["run"] in task_labels]  # this task's runs, as its table names them
    label_groups(named, [])
    found = sorted({task_labels[run["run"]] for run in named if run["label"] == row})
    if len(found) != 1:
        return None
    return found[0] + (f" @ {step}" if step is not None else "") + (f" + {scaling}" if plus else "")


def missing_task_reference(results: dict) -> Optional[str]:
    """Why a task report has no comparisons, when the reference row it was asked for (eval.reference,
    ``ropelab regenerate --reference``) is none of its rows; with the rows it could name."""
    runs = results["runs"]
    asked = next((run["eval"].get("reference") for run in runs if run.get("eval")), None) or DEFAULT_REFERENCE
    labels: set[str] = set()
    for task in {row["task"] for row in results["results"]}:  # each task's table names its rows among its runs
        present = {row["run"] for row in results["results"] if row["task"] == task}
        named = [dict(run) for run in runs if run["run"] in present]
        label_groups(named, [])
        labels |= {run["label"] for run in named}
    if not labels or split_step(asked)[0].partition(" + ")[0] in labels:
        return None
    labels = sorted(labels, key=label_order)
    return (f"the reference row {asked!r} (eval.reference, --reference) is none of the task report's rows, so its "
            f"tasks have no comparisons; rows: {', '.join(labels)}. Rerun with --reference ROW: only the report is "
            "made again.")


class Scored(NamedTuple):
    """One run's answers at one length: how many right of how many, and, where its cells keep
    them, each instance's outcome (an array of 0/1 in depth order) for the paired instance part."""
    correct: int
    total: int
    outcomes: Optional[np.ndarray] = None


def _scored(by_length: dict[int, list[dict]], length: int) -> Optional[Scored]:
    """One run's answers at a length, over its depth cells in depth order; None where none scored."""
    cells = sorted((c for c in by_length.get(length, []) if c["status"] == "ok"),
                   key=lambda c: -1.0 if c["depth"] is None else c["depth"])
    if not cells:
        return None
    correct, total = sum(c["correct"] for c in cells), sum(c["total"] for c in cells)
    if all("outcomes" in c for c in cells):
        right = np.array([ch == "1" for c in cells for ch in c["outcomes"]], dtype=np.float64)
    elif all("first_error" in c and "answer_tokens" in c for c in cells):
        right = np.concatenate([np.equal(c["first_error"], c["answer_tokens"]) for c in cells]).astype(np.float64)
    else:  # scored before cells kept each instance's outcome
        right = None
    return Scored(correct, total, right)


def _outcomes(side: dict[str, Scored], runs: list[str], units: tuple[str, ...]) -> Optional[np.ndarray]:
    """(n,) a row's outcome per instance, averaged over its seeds (each unit once); None where a
    run kept counts alone."""
    kept = [side[run].outcomes for run in runs]
    if any(k is None for k in kept) or len({len(k) for k in kept}) != 1:
        return None
    return unit_means(np.stack(kept), units).mean(axis=0)


def _instance_part(accuracies: list[np.ndarray], n: float, outcomes: list[Optional[np.ndarray]]) -> Part:
    a, b = outcomes
    if a is not None and b is not None and len(a) == len(b) and len(a) > 1:
        d, m = a - b, len(a) + 2  # with Agresti & Min's pseudo-pairs (the module's docstring)
        spread = (float(np.sum(d * d)) + 1) / m - (float(np.sum(d)) / m) ** 2
        return Part(spread / m, len(a) - 1)
    variance = 0.0
    for acc in accuracies:
        p = (float(acc.mean()) * n + 1) / (n + 2)
        variance += p * (1 - p) / (n + 2)
    return Part(variance, n - 1)


def _seed_part(values: np.ndarray) -> Part:
    s2 = float(np.var(values, ddof=1))
    return Part(s2 / len(values), len(values) - 1, s2, len(values))


def accuracy_difference(a: dict[str, Scored], b: dict[str, Scored], meta: dict[str, dict]) -> Optional[Estimate]:
    """Accuracy of row ``a`` minus row ``b`` ({run: Scored, or a (correct, total[, outcomes])
    tuple} each; ``meta``: run -> its record, for its seed and parent), or None where a row has no
    scored run. The estimate's ``seeds`` are the fewest replicates (seeds, or parents) of either
    row, ``pairing`` "seed" or "welch"; no seed part (so an interval over the instances alone)
    where a row has one."""
    if not a or not b:
        return None
    a, b = ({run: Scored(*s) for run, s in side.items()} for side in (a, b))

    def key(run: str) -> tuple:
        return meta[run]["seed"], replicate_unit(meta[run]) if meta[run].get("parent") else None

    def accuracies(side: dict[str, Scored], order: list[str]) -> np.ndarray:
        return np.array([side[run].correct / side[run].total for run in order])

    n = float(np.mean([scored.total for scored in [*a.values(), *b.values()]]))
    keys_a, keys_b = {key(r): r for r in a}, {key(r): r for r in b}
    runs_a, runs_b = sorted(a), sorted(b)
    units_a = tuple(replicate_unit(meta[r]) for r in runs_a)
    units_b = tuple(replicate_unit(meta[r]) for r in runs_b)
    means_a, means_b = unit_means(accuracies(a, runs_a), units_a), unit_means(accuracies(b, runs_b), units_b)
    point = float(means_a.mean() - means_b.mean())
    instances = _instance_part([means_a, means_b], n, [_outcomes(a, runs_a, units_a), _outcomes(b, runs_b, units_b)])
    if len(keys_a) == len(a) and len(keys_b) == len(b) and set(keys_a) == set(keys_b):
        order = sorted(keys_a)
        pairs_a = [keys_a[k] for k in order]
        units = tuple(replicate_unit(meta[r]) for r in pairs_a)
        diffs = unit_means(accuracies(a, pairs_a) - accuracies(b, [keys_b[k] for k in order]), units)
        if len(diffs) < 2:
            return Estimate(point, (instances,), len(diffs))
        return Estimate(point, (_seed_part(diffs), instances), len(diffs))
    if min(len(means_a), len(means_b)) < 2:
        return Estimate(point, (instances,), min(len(means_a), len(means_b)), "welch")
    return Estimate(point, (_seed_part(means_a), _seed_part(means_b), instances),
                    min(len(means_a), len(means_b)), "welch")


def _extreme(scored: list[Scored]) -> Optional[str]:
    """"floor" where every run of both rows answered every instance wrong, "ceiling" where every
    one answered every instance right: no test (the module's "Which comparisons form one
    correction family"); else None."""
    if all(s.correct == 0 for s in scored):
        return "floor"
    if all(s.correct == s.total for s in scored):
        return "ceiling"
    return None


def _across_runs(estimate: Estimate) -> bool:
    """Whether the estimate has a seed part, i.e. speaks of training runs (a test), not one seed."""
    return any(p.per_seed is not None for p in estimate.parts)


def task_comparisons(kept: dict[str, RunCells], reference: str, meta: dict[str, dict]
                     ) -> dict[str, dict[int, dict]]:
    """"row vs partner" -> length -> {"estimate", "mark"} for every row of one task but the
    reference (``kept``: label -> run -> length -> cells, the seeds each row pools), marked
    after the Benjamini–Hochberg correction over the whole table's tests (those with a seed
    part: a difference across training runs)."""
    out: dict[str, dict[int, dict]] = {}
    for label in sorted(kept, key=label_order):
        partner = budget_partner(label, reference)
        if label == partner or partner not in kept:
            continue
        cells = {}
        lengths = sorted({n for by_length in kept[label].values() for n in by_length}
                         & {n for by_length in kept[partner].values() for n in by_length})
        for n in lengths:
            a = {run: c for run, by_length in kept[label].items() if (c := _scored(by_length, n))}
            b = {run: c for run, by_length in kept[partner].items() if (c := _scored(by_length, n))}
            if len(a) < len(kept[label]) or len(b) < len(kept[partner]):
                continue  # some pooled seed could not serve this length: no like-for-like difference
            estimate = accuracy_difference(a, b, meta)
            if estimate is not None:
                extreme = _extreme([*a.values(), *b.values()]) if _across_runs(estimate) else None
                cells[n] = {"estimate": estimate, "mark": "", "extreme": extreme}
        out[f"{label} vs {partner}"] = cells
    tested = [c for cells in out.values() for c in cells.values()
              if _across_runs(c["estimate"]) and c["extreme"] is None]
    for cell, p in zip(tested, benjamini_hochberg([c["estimate"].p_value for c in tested])):
        cell["mark"] = mark(cell["estimate"].point, p)
    return out


def signed(x: float) -> str:
    """A difference of accuracies to two decimals, or three where two would read ±0.00 of a
    difference that is not zero (as -0.003, not -0.00), or one significant figure where three
    would too (-0.0003, not -0.000). A difference below 1e-12 is the rounding of two equal
    accuracies (a mean of seeds' accuracies minus the same mean summed in another order), not a
    difference: it prints as +0.00, not +1e-16; differences of counts of instances are far above it."""
    if abs(x) < 1e-12:
        x = 0.0
    if x == 0 or f"{abs(x):.2f}" != "0.00":
        return f"{x:+.2f}"
    return f"{x:+.3f}" if f"{abs(x):.3f}" != "0.000" else f"{x:+.1g}"


def _cell_text(cell: Optional[dict]) -> str:
    if cell is None:
        return "–"
    estimate = cell["estimate"]
    if cell.get("extreme"):
        return f"{signed(estimate.point)} ({cell['extreme']}: no test)"
    if not _across_runs(estimate):
        return f"{signed(estimate.point)} (one seed)"
    low, high = estimate.interval()
    return f"{signed(estimate.point)} [{signed(max(low, -1.0))}, {signed(min(high, 1.0))}] {cell['mark']}"


def _power_text(cell: Optional[dict]) -> str:
    """'±d · n' (eval/reporting/stats.py: detectable, seeds_needed), '–' without an interval across runs."""
    if cell is None or cell.get("extreme") or not _across_runs(cell["estimate"]):
        return "–"
    estimate = cell["estimate"]
    need = seeds_needed(estimate, estimate.point)
    return f"±{detectable(estimate):.2f} · {'>100' if need is None else need}"


def _why_none(kept: dict[str, RunCells], reference: str, unlearned: list[str]) -> str:
    """Why the reference row has no comparison: which side learned nothing, or no shared length."""
    if not any(kept.get(budget_partner(label, reference)) for label in kept if label != reference):
        return "no seed of it learned the task"
    if all(label in unlearned for label in kept if budget_partner(label, reference) != label):
        return "no seed of the other rows learned the task (" + ", ".join(f"`{n}`" for n in unlearned) + ")"
    return "no other row scored the same lengths"


def _marks_text(tested: int, extremes: int, so_far: str) -> str:
    """What the marks mean and over which family, or why there are none."""
    left_out = (f"; {extremes} comparison{'s' if extremes != 1 else ''} where both rows are at the floor (every "
                "instance wrong) or the ceiling (every instance right) are no test and stay out of it"
                if extremes else "")
    if tested:
        return ("Marks: ▲ higher accuracy than the row compared with, ▼ lower, ~ neither, where the test across "
                "training runs rejects no difference after the Benjamini–Hochberg correction over this table's "
                f"{tested} test{'s' if tested != 1 else ''}{so_far}{left_out}.")
    if extremes:
        return ("No test across training runs: every comparison is at the floor or the ceiling, or has one seed "
                "on a side, so none is marked and no power can be stated.")
    return ("No test across training runs: each comparison has one seed on a side, so its difference speaks of "
            "those two training runs only, marked (one seed), and no power can be stated.")


def comparison_section(kept: dict[str, RunCells], reference: Optional[str], meta: dict[str, dict],
                       lengths: list[int], train_lens: dict[str, int], mark_length, missing: int = 0) -> list[str]:
    """The task section's comparisons with the reference row: a sentence and a table, or a
    sentence saying why there are none (nothing for a task with one row). ``missing``: runs
    the report lists as missing; while there are any, the correction's family is the tests
    of the runs in so far, and the sentence says a mark may change as the others arrive."""
    if len(kept) < 2:
        return []
    if reference is None or not any(budget_partner(label, reference) in kept for label in kept):
        return ["", "Compared with the reference row: none; eval.reference names no row of this task."]
    comparisons = task_comparisons(kept, reference, meta)
    unlearned = [label for label in sorted(kept, key=label_order) if not kept[label]]
    note = "" if split_step(reference)[1] is not None else unlike_note(
        {label: [meta[run] for run in runs] for label, runs in kept.items()}, reference, sorted(kept, key=label_order))
    unlike = ["", note] if note else []
    if not any(comparisons.values()):
        return [*unlike, "", f"Compared with `{reference}`: none; {_why_none(kept, reference, unlearned)}."]
    tested = sum(1 for cells in comparisons.values() for c in cells.values() if c["mark"])
    extremes = sum(1 for cells in comparisons.values() for c in cells.values() if c.get("extreme"))
    welch = sorted(name for name, cells in comparisons.items()
                   if any(c["estimate"].pairing == "welch" for c in cells.values()))
    ref_row, step = split_step(reference)
    pairing = (f" Each row is compared with `{ref_row}` after the same number of steps, and `{ref_row}`'s own "
               f"checkpoints with its step {step}." if step is not None else "")
    unpaired = ("; unpaired (Welch), as their pooled seeds differ: " + ", ".join(f"`{n}`" for n in welch)
                if welch else "")
    unlearned_text = (" Not compared, as no seed of theirs learned the task: " + ", ".join(f"`{n}`" for n in unlearned)
                      + "." if unlearned else "")

    def table(text) -> str:
        rows = [([name], train_lens.get(name.partition(" vs ")[0]), [text(cells.get(n)) for n in lengths])
                for name, cells in comparisons.items() if cells]
        return length_table(["row vs compared"], lengths, rows, mark=mark_length)

    so_far = (f" of the runs in so far ({missing} run{'s' if missing != 1 else ''} listed as missing would add "
              "tests to the tables of their rows and may change marks)" if missing else "")
    marks = _marks_text(tested, extremes, so_far)
    power = ["", "Power across training runs: the smallest accuracy difference each comparison detects with its "
             "seeds (80% power, two-sided 5%, before the correction; seeds are parents for fine-tunes) · the seeds per "
             "row the observed difference would need (>100: more instances, not seeds, would decide it):", "",
             table(_power_text)] if tested else []
    return [*unlike, "", f"Compared with `{reference}`: the first row's accuracy minus the second's, over the seeds each "
            f"row pools, with its 95% interval across training runs and instances (eval/tasks/compare.py).{pairing} "
            f"Rows pooling the same seeds are paired seed by seed (by parent where fine-tunes share one){unpaired}. "
            f"{marks}{unlearned_text}", "", table(_cell_text)] + power

