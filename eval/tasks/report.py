"""Turn task results into report.md, results.json and PNG plots.

One table per task: a row per encoding (plus RoPE scaling, and checkpoint "@ STEP" with
eval.steps), a column per length, headed by its multiple of L where every row has one
training length L, else beside an L column (eval/reporting/tables.py: length_table). Runs
that are the same experiment apart from the seed (configs/experiment.py) are one row.

**Learned seeds.** A seed has learned a task when its accuracy at the reference length R
(``eval.tasks.reference_length``, else its training length L) is at least
``eval.tasks.learned_accuracy`` (default 0.95, the competence stop's usual threshold); a
row's cells pool the seeds that learned it, and say how many did ("3/5"), because the
accuracy beyond L of a seed that never learned the task at L says nothing about its
encoding. With ``learned_accuracy: null`` every seed pools (a fine-tuning budget, whose
forgetting is the point), and so do seeds scored on a task they never trained on (passkey
in the paper's prompt on a text run: "all N"). Pooled instances give correct / scored over those seeds (and
depths) with a 95% interval that counts both the instances (Wilson) and the disagreement
between seeds (a t-interval across training runs; eval/reporting/stats.py); a second table shows every
seed's accuracy, those that did not learn the task in parentheses.

Where a seed's test instances cannot settle whether it learned the task (the one-sided 95%
Wilson bound of its accuracy at R on the other side of the threshold), a table names it and
the range the row's learned count spans (eval/tasks/borderline.py). Each task adds its seeds'
accuracy at L during training (eval/tasks/learning.py) and its effective length
(eval/tasks/effective_length.py); passkey and multikey add depth × length heatmaps and, where a
seed did not learn the task, its accuracy by depth at R (eval/tasks/depth.py), passkey k_max
per seed (eval/tasks/effective_length.py), and every task where the first error falls
(eval/tasks/first_error.py; copy and addition in multiples of the answer's length, the others
by answer token; tasks other than copy and addition once scored with it; a row no seed
learned shows every seed's, marked), and where the answer is one of the
prompt's candidates, what the wrong answers were (eval/tasks/answers.py: another candidate
copied, and whether it sat nearer the question than the asked needle).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Optional

import numpy as np

from ropelab.common.atomic import write_text_atomic
from ropelab.configs.tasks import TASK_NAMES, TaskEvalConfig
from ropelab.eval.tasks.effective_length import effective_section
from ropelab.eval.tasks.effective_length import K_MAX_DOC as KMAX_DOC
from ropelab.eval.reporting.labels import (encoding_label, label_encodings, label_order, parents_note, plan_note,
                                           replicate_unit, replicate_units, units_of, with_scaling)
from ropelab.eval.lm.report import regenerate_line, write_report_files
from ropelab.eval.tasks.findings import task_findings
from ropelab.eval.reporting.runs_section import commit_lines, evaluation_provenance, incomplete_note, missing_lines, schedule_lines, task_runs_table
from ropelab.eval.reporting.stats import pooled_accuracy_interval
from ropelab.eval.reporting.tables import length_table, train_lengths
from ropelab.eval.tasks.compare import comparison_section, task_reference
from ropelab.eval.tasks.plots import plot_accuracy, plot_heatmaps
from ropelab.eval.tasks.answers import answers_section
from ropelab.eval.tasks.borderline import borderline_section
from ropelab.eval.tasks.depth import depth_section
from ropelab.eval.tasks.learning import learning_section
from ropelab.eval.tasks.first_error import positions_section


def label_rows(runs: list[dict], rows: list[dict]) -> dict[str, str]:
    """Row label per run within one task's table: the encoding, plus the run-name stem where
    one encoding has several experiments in the table. Returns {run: label}."""
    present = {r["run"] for r in rows}
    groups: dict[str, set] = defaultdict(set)
    for run in runs:
        if run["run"] in present:
            groups[run["encoding"]].add(run["group"])
    return {run["run"]: encoding_label(run["encoding"]) + (f" [{run['stem']}]" if len(groups[run["encoding"]]) > 1 else "")
            for run in runs if run["run"] in present}


def row_name(labels: dict[str, str], row: dict) -> str:
    """A table row: the run's label, its checkpoint when eval.steps named several ("ROW @ STEP"),
    and the RoPE scaling."""
    step = f" @ {row['eval_step']}" if "eval_step" in row else ""
    return with_scaling(labels[row["run"]] + step, row["scaling"])


def pooled(cells: list[dict], units: Optional[dict[str, str]] = None) -> dict:
    """Counts of cells pooled (seeds, depths) with a 95% interval over seeds and instances
    (eval/reporting/stats.py: pooled_accuracy_interval; ``units``: run -> its replicate unit, so the
    fine-tunes of one parent count once); n/a if none was scored."""
    ok = [c for c in cells if c["status"] == "ok"]
    if not ok:
        return {"na": cells[0].get("note", "n/a"), "train_len": cells[0]["train_len"]}
    per_run: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for c in ok:
        per_run[c["run"]][0] += c["correct"]
        per_run[c["run"]][1] += c["total"]
    counts = [tuple(v) for v in per_run.values()]
    correct, total = map(sum, zip(*counts))
    low, high = pooled_accuracy_interval(counts, units_of(units, per_run))
    return {"accuracy": correct / total, "ci_low": low, "ci_high": high, "correct": correct, "total": total,
            "seeds": len(counts), "train_len": cells[0]["train_len"]}


Seeds = dict[str, dict[str, dict[int, list[dict]]]]  # label -> run -> length -> cells


def settings_of(run: dict) -> dict:
    """A run's report settings (eval.tasks; results written before they existed: the defaults,
    but every seed pooled where learned_accuracy was not yet recorded):
    {reference: R, learned_at: threshold or None, fraction: f, chance: {task: c}, unit: its
    replicate unit (eval/reporting/labels.py)}."""
    default, tasks = TaskEvalConfig(), (run.get("eval") or {}).get("tasks") or {}
    # Results written before learned_accuracy existed pooled every seed, and are made again so
    # (their numbers as they were reported); newer results name it, its default included.
    return {"reference": tasks.get("reference_length") or run["train_len"],
            "learned_at": tasks.get("learned_accuracy"),
            "fraction": tasks.get("effective_fraction", default.effective_fraction),
            "chance": run.get("chance") or {},  # results written before it: 0, as they were reported
            "unit": replicate_unit(run)}


def by_seed(runs: list[dict], rows: list[dict], task: str) -> Seeds:
    """label -> run -> length -> its cells (one per depth)."""
    task_rows = [r for r in rows if r["task"] == task]
    labels = label_rows(runs, task_rows)
    out: dict[str, dict[str, dict[int, list[dict]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in task_rows:
        out[row_name(labels, r)][r["run"]][r["length"]].append(r)
    return out


def seed_accuracy(cells: list[dict]) -> Optional[float]:
    """One seed's accuracy pooled over depths, None where not served (n/a)."""
    return pooled(cells).get("accuracy")


def tasks_trained(run: dict) -> list[str]:
    """The tasks a run trained on in the wording it was scored in (results written before the
    record existed: a synthetic run's own, none for a text run)."""
    if "tasks_trained" in run:
        return run["tasks_trained"]
    trained_on = run.get("trained_on", "")
    return [] if trained_on.startswith("text") else trained_on.split("+")


def learned(run: dict, by_length: dict[int, list[dict]]) -> Optional[bool]:
    """Whether a seed learned the task: its accuracy at the reference length ≥ the threshold
    (None: no threshold, the reference length not scored, or a task the run never trained on,
    such as passkey in the paper's prompt on a text run)."""
    settings = settings_of(run)
    cells = by_length.get(settings["reference"])
    task = next((c["task"] for group in by_length.values() for c in group), None)
    if settings["learned_at"] is None or not cells or task not in tasks_trained(run):
        return None
    accuracy = seed_accuracy(cells)
    return accuracy is not None and accuracy >= settings["learned_at"] - 1e-12


def pooled_seeds(runs: list[dict], rows: list[dict], task: str) -> tuple[Seeds, dict[str, tuple[int, int, bool]]]:
    """(``by_seed`` restricted to the seeds each row pools: those that learned the task, or all
    where learning is not judged; {label: (seeds that learned, seeds, whether judged)})."""
    meta = {r["run"]: r for r in runs}
    kept, counts = {}, {}
    for label, per_run in by_seed(runs, rows, task).items():
        status = {run: learned(meta[run], by_length) for run, by_length in per_run.items()}
        kept[label] = {run: by_length for run, by_length in per_run.items() if status[run] is not False}
        counts[label] = (sum(v is True for v in status.values()), len(status), None not in status.values())
    return kept, counts


def learned_text(counts: tuple[int, int, bool]) -> str:
    k, n, judged = counts
    return f"{k}/{n}" if judged else f"{n}, not judged"


def summarize(runs: list[dict], rows: list[dict], task: str) -> dict[str, dict[int, dict]]:
    """label -> length -> the cell pooled over the seeds that learned the task, with every seed's
    accuracy under "per_seed" ([(accuracy, learned)]); the label's learned count under "seeds_learned"."""
    everyone, (kept, counts) = by_seed(runs, rows, task), pooled_seeds(runs, rows, task)
    meta, units = {r["run"]: r for r in runs}, replicate_units(runs)
    out: dict[str, dict[int, dict]] = {}
    for label, per_run in everyone.items():
        out[label] = {}
        for length in sorted({n for by_length in per_run.values() for n in by_length}):
            cells = [c for by_length in kept[label].values() for c in by_length.get(length, [])]
            every = [c for by_length in per_run.values() for c in by_length.get(length, [])]
            if not cells and any(c["status"] == "ok" for c in every):
                cell = {"na": "no seed learned the task", "train_len": every[0]["train_len"]}
            else:  # a length no seed could serve says why, learned or not
                cell = pooled(cells or every, units)
            cell["per_seed"] = [(seed_accuracy(by_length[length]), learned(meta[run], by_length))
                                for run, by_length in sorted(per_run.items()) if length in by_length]
            cell["seeds_learned"] = counts[label]
            out[label][length] = cell
    return out


def _times_l(n: int, train_len) -> str:
    return f"{n} ({n / train_len:g}×L)" if train_len else str(n)


def parents_length(runs: list[dict]) -> Optional[int]:
    """L₀, where every run is a fine-tune of parents trained at one length other than the runs'
    own (context extension: the study's multiples speak of the parents' L); else None."""
    if not runs or not all(run.get("parent") for run in runs):
        return None
    lengths = {run["parent"].get("train_len") for run in runs}
    base = lengths.pop() if len(lengths) == 1 else None
    return base if base and all(run["train_len"] != base for run in runs) else None


def length_marks(runs: list[dict]):
    """How tables head their lengths: multiples of the rows' training length L ("256 (2×L)"),
    or of the parents' L₀ where ``parents_length`` finds one ("512 (4×L₀)")."""
    base = parents_length(runs)
    return _times_l if base is None else (lambda n, _: f"{n} ({n / base:g}×L₀)")


def _table(heads: list[str], tables: dict[str, dict[str, dict[int, dict]]], lengths: list[int], cell,
           mark=_times_l) -> str:
    """One row per (table, label) with ``cell(label's cell or None)`` per length, after its
    learned seeds; a table's name, where there are several, in the first column. L:
    eval/reporting/tables.py's length_table."""
    rows = []
    for name, table in tables.items():
        for label in sorted(table, key=label_order):
            row_len = next((c["train_len"] for c in table[label].values() if "train_len" in c), None)
            counts = next((c["seeds_learned"] for c in table[label].values() if "seeds_learned" in c), None)
            names = ([name] if len(heads) > 2 else []) + [label, learned_text(counts) if counts else "–"]
            rows.append((names, row_len, [cell(table[label].get(n)) for n in lengths]))
    return length_table(heads, lengths, rows, mark=mark)


def _accuracy_cell(c: Optional[dict]) -> str:
    return ("–" if c is None else f"n/a ({c['na']})" if "na" in c
            else f"{c['accuracy']:.2f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]")


def _seeds_cell(c: Optional[dict]) -> str:
    seeds = (c or {}).get("per_seed")
    if not seeds:
        return "–"
    return " / ".join("n/a" if a is None else f"{a:.2f}" if ok is not False else f"({a:.2f})" for a, ok in seeds)


def accuracy_table(table: dict[str, dict[int, dict]], lengths: list[int], mark=_times_l) -> str:
    return _table(["row", "seeds learned"], {"": table}, lengths, _accuracy_cell, mark)


def spread_table(table: dict[str, dict[int, dict]], lengths: list[int], mark=_times_l) -> str:
    return _table(["row", "seeds learned"], {"": table}, lengths, _seeds_cell, mark)


def heatmap_grids(runs: list[dict], rows: list[dict], task: str) -> dict[str, tuple[list[float], list[int], np.ndarray]]:
    """label -> (depths, lengths, accuracy pooled over the learned seeds (depths × lengths), NaN for n/a)."""
    grids = {}
    for label, per_run in pooled_seeds(runs, rows, task)[0].items():
        if not per_run:
            continue
        cells: dict[tuple[float, int], list[dict]] = defaultdict(list)
        for by_length in per_run.values():
            for n, group in by_length.items():
                for c in group:
                    cells[(c["depth"], n)].append(c)
        depths, lengths = sorted({d for d, _ in cells}), sorted({n for _, n in cells})
        acc = np.full((len(depths), len(lengths)), np.nan)
        for (d, n), group in cells.items():
            acc[depths.index(d), lengths.index(n)] = pooled(group).get("accuracy", np.nan)
        grids[label] = (depths, lengths, acc)
    return grids


def kmax_table(runs: list[dict], rows: list[dict], kmax_rows: list[dict]) -> list[str]:
    labels = label_rows(runs, [r for r in rows if r["task"] == "passkey"])
    parents = {replicate_unit(r) for r in runs if r.get("parent")}
    # Fine-tunes of several parents share seeds: each value names its parent too.
    seeds = {r["run"]: (f"parent {Path(r['parent']['run']).name}, " if len(parents) > 1 and r.get("parent") else "")
             + f"seed {r['seed']}" for r in runs}
    by_label: dict[str, list[str]] = defaultdict(list)
    for k in kmax_rows:
        value = "< shortest" if k["kmax"] is None else str(k["kmax"])
        by_label[row_name(labels, k)].append(f"{value} ({seeds[k['run']]})")
    return ["| row | k_max per run |", "|---|---|"] + [f"| {label} | {', '.join(by_label[label])} |"
                                                    for label in sorted(by_label, key=label_order)]


def summary_table(tables: dict[str, dict[str, dict[int, dict]]], lengths: list[int], mark=_times_l) -> str:
    """Every task's rows in one table (task, row, learned seeds, a cell per length)."""
    return _table(["task", "row", "seeds learned"], tables, lengths, _accuracy_cell, mark)


HEADER = ("A cell is the exact-match accuracy (an instance counts only if every answer token is the model's most "
          "likely next token; training/exact_match.py) pooled over the seeds of a row that learned the task (accuracy "
          "at the reference length R, the training length L unless the runs' eval.tasks.reference_length says "
          "otherwise, at least eval.tasks.learned_accuracy; the learned column says how many of the row's seeds "
          "did, \"n, not judged\" where learning was not judged and all n pool) and, for passkey and multikey, "
          "over needle depths, with its 95% interval in brackets: the wider of the Wilson interval of the pooled "
          "instances and a t-interval across training runs (the spread of the seeds' accuracies, plus the "
          "instances' binomial variance, Satterthwaite's degrees of freedom; eval/reporting/stats.py: accuracy_estimate), so "
          "seeds that disagree widen it; "
          "one seed gets the Wilson interval alone, which says nothing about other training runs. The competence "
          "column of the runs says whether training reached train.stop_at_accuracy at L, and at which step, or ran "
          "out of budget, with its accuracy at the end and at its check four fifths of the way there (a run still "
          "learning when its budget ended, or one long stalled).")


def _task_section(task: str, table: dict[str, dict[int, dict]], rows: list[dict], runs: list[dict],
                  out: Path, missing: int = 0) -> list[str]:
    task_rows = [r for r in rows if r["task"] == task]
    lengths = sorted({r["length"] for r in task_rows})
    per_cell = sorted({r["total"] for r in task_rows if r["status"] == "ok"})
    depth = any(r["depth"] is not None for r in task_rows)
    mark = length_marks(runs)
    md = ["", f"## {task}", "", accuracy_table(table, lengths, mark), "",
          f"Instances per run and cell: {', '.join(map(str, per_cell))}" + (" (per depth)" if depth else "") + ".", "",
          "Per-seed accuracy (one value per run of the row; in parentheses those that did not learn the task):", "",
          spread_table(table, lengths, mark), "", f"![{task} accuracy vs length](accuracy_{task}.png)"]
    train_lens = sorted({c["train_len"] for cells in table.values() for c in cells.values()})
    labels = label_rows(runs, task_rows)
    encodings = {row_name(labels, r): r["encoding"] for r in task_rows}
    plot_accuracy(table, train_lens, out / f"accuracy_{task}.png", f"{task}: exact-match accuracy", encodings)
    kept, settings = pooled_seeds(runs, rows, task)[0], {r["run"]: settings_of(r) for r in runs}
    everyone, meta = by_seed(runs, rows, task), {r["run"]: r for r in runs}
    md += learning_section(task, everyone, meta, out)
    status = {run: learned(meta[run], by_length) for per_run in everyone.values() for run, by_length in per_run.items()}
    md += borderline_section(task, everyone, status, settings)
    reference = task_reference(runs, label_rows(runs, task_rows))
    md += comparison_section(kept, reference, meta, lengths, train_lengths(table), mark,
                             missing)
    md += effective_section(kept, settings, seed_accuracy, task)
    grids = heatmap_grids(runs, rows, task) if depth else {}
    if grids:
        plot_heatmaps(grids, out / f"{task}_heatmap.png",
                      f"{task}: accuracy by needle depth and length (seeds that learned it)")
        md += ["", f"![{task} depth × length heatmaps]({task}_heatmap.png)"]
    if depth:
        md += depth_section(task, kept, everyone, settings)
    return (md + positions_section(task, kept, settings, out, everyone)
            + answers_section(task, kept, everyone, replicate_units(runs)))


def findings(runs: list[dict], rows: list[dict], tasks: list[str], missing: int) -> list[str]:
    """The summary's findings, one sentence per line (eval/tasks/findings.py)."""
    meta, base = {r["run"]: r for r in runs}, parents_length(runs)
    train_len = base or min((r["train_len"] for r in runs), default=1)
    suffix = "L₀" if base else "L"

    def multiple(n: int) -> str:
        return suffix if n == train_len else f"{n / train_len:g}{suffix}"

    found = []
    for task in tasks:
        kept, counts = pooled_seeds(runs, rows, task)
        reference = task_reference(runs, label_rows(runs, [r for r in rows if r["task"] == task]))
        found += task_findings(task, kept, counts, reference, meta, multiple)
    if missing:
        found.append(f"{missing} runs of the grid are missing (listed under Runs); a mark may change when they arrive.")
    return [f"- {sentence}" for sentence in found]


TASK_FIGURES = ("accuracy_*.png", "*_heatmap.png", "*_first_error.png", "*_learning.png")


def variant_lines(runs: list[dict]) -> list[str]:
    """What the scored instances changed of the runs' own task settings (eval.tasks.variant)."""
    given: list[dict] = []
    for run in runs:
        variant = ((run.get("eval") or {}).get("tasks") or {}).get("variant") or {}
        if (setting := {k: v for k, v in variant.items() if v is not None}) not in given:
            given.append(setting)
    if not any(given):
        return []
    text = " and ".join(", ".join(f"{k}={v}" for k, v in g.items()) or "the runs' own" for g in given)
    return [f"**Scored on a variant of the trained task** (eval.tasks.variant): {text}. These instances differ "
            "from those the runs trained on, and whether a seed learned the task is judged on them."]


def write_task_report(results: dict, out: Path) -> None:
    """results.json, report.md and the figures, written as the perplexity report's are
    (eval/lm/report.py: ``write_report_files``): each file atomically, an earlier report's
    figures this one no longer links removed only once it is whole."""
    write_report_files(out, results, lambda: _write_markdown(results, out), TASK_FIGURES)


def _write_markdown(results: dict, out: Path) -> str:
    runs, rows = results["runs"], results["results"]
    lengths = sorted({r["length"] for r in rows})
    remade = (f", made again {results['remade']} from its results.json (ropelab regenerate)"
              if results.get("remade") else "")
    base = parents_length(runs)
    tasks = sorted({r["task"] for r in rows}, key=TASK_NAMES.index)
    tables = {task: summarize(runs, rows, task) for task in tasks}
    md = ["# Task accuracy report", "", f"Created {results['created']}{remade}. Training length L = "
          f"{', '.join(map(str, sorted({r['train_len'] for r in runs})))}" + (
              f", fine-tuned from parents trained at L₀ = {base}; tables head lengths by their multiple of L₀"
              if base else "") + f". {regenerate_line(out)}",
          *incomplete_note(results.get("missing")),
          "", "## Summary", "",
          "Exact-match accuracy of the seeds that learned each task (the learned column), pooled, with its 95% "
          "interval over seeds and instances; each task's section below has its per-seed values, comparisons, "
          "effective lengths and errors." + plan_note(label_encodings(results)), "",
          summary_table(tables, lengths, length_marks(runs)), "",
          *findings(runs, rows, tasks, len(results.get("missing") or ())),
          "", "## How to read this report", "", HEADER, *parents_note(runs),
          "", "## Runs", "", *commit_lines(runs), *evaluation_provenance(rows), *variant_lines(runs), "",
          *task_runs_table(results["runs"])]
    for line in schedule_lines(runs):
        md += ["", line]
    if results.get("missing"):
        md += ["", "**Missing runs** (not in the tables):", ""] + missing_lines(results["missing"])
    for task, table in tables.items():
        md += _task_section(task, table, rows, runs, out, len(results.get("missing") or ()))
    if results.get("kmax"):
        definition = KMAX_DOC.split("\n\n")[1:4]
        k = results["kmax"][0]
        depths = sorted({r["depth"] for r in rows if r["task"] == "passkey"})
        md += ["", "## Passkey: k_max", "",
               *[line for part in definition for line in
                 (part if part.startswith("    ") else " ".join(x.strip() for x in part.splitlines()), "")],
               f"Here: threshold {k['threshold']:g}, {k['samples']} prompts per (length, depth) cell, depths "
               f"{', '.join(f'{d:g}' for d in depths)}, lengths {', '.join(map(str, lengths))}.", "",
               *kmax_table(runs, rows, results["kmax"])]
    markdown = "\n".join(md) + "\n"
    write_text_atomic(out / "report.md", markdown)
    return markdown
