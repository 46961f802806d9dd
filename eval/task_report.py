"""Turn task results into report.md, results.json and PNG plots.

One table per task: a row per encoding (plus RoPE scaling, and checkpoint "@ STEP" with
eval.steps), a column per length, headed by its multiple of L where every row has one
training length L, else beside an L column (eval/tables.py: length_table). Runs
that are the same experiment apart from the seed (configs/experiment.py) are one row;
their instances are pooled, so a cell is correct / scored over every seed (and, for
passkey, every depth) with a 95% interval that counts both the instances (Wilson) and the
disagreement between seeds (a t-interval across training runs; eval/stats.py), and a second table
shows the per-seed accuracies. Passkey adds depth × length heatmaps and
k_max per seed (eval/kmax.py states the definition).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Optional

import numpy as np

from configs.tasks import TASK_NAMES
from eval.kmax import __doc__ as KMAX_DOC
from eval.labels import encoding_label, label_order, with_scaling
from eval.stats import pooled_accuracy_interval
from eval.tables import length_table
from eval.task_plots import plot_accuracy, plot_heatmaps


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


def pooled(cells: list[dict]) -> dict:
    """Counts of cells pooled (seeds, depths) with a 95% interval over seeds and instances
    (eval/stats.py: pooled_accuracy_interval); n/a if none was scored."""
    ok = [c for c in cells if c["status"] == "ok"]
    if not ok:
        return {"na": cells[0].get("note", "n/a"), "train_len": cells[0]["train_len"]}
    per_run: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for c in ok:
        per_run[c["run"]][0] += c["correct"]
        per_run[c["run"]][1] += c["total"]
    counts = [tuple(v) for v in per_run.values()]
    correct, total = map(sum, zip(*counts))
    low, high = pooled_accuracy_interval(counts)
    return {"accuracy": correct / total, "ci_low": low, "ci_high": high, "correct": correct, "total": total,
            "seeds": len(counts), "train_len": cells[0]["train_len"]}


def summarize(runs: list[dict], rows: list[dict], task: str) -> dict[str, dict[int, dict]]:
    """label -> length -> pooled cell, plus per-seed accuracies under "per_seed"."""
    task_rows = [r for r in rows if r["task"] == task]
    labels = label_rows(runs, task_rows)
    grouped: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in task_rows:
        grouped[row_name(labels, r)][r["length"]].append(r)
    out: dict[str, dict[int, dict]] = {}
    for label, by_length in grouped.items():
        out[label] = {}
        for length, cells in by_length.items():
            cell = pooled(cells)
            if "accuracy" in cell:
                per_run: dict[str, list[dict]] = defaultdict(list)
                for c in cells:
                    per_run[c["run"]].append(c)
                seeds = [pooled(cs) for cs in per_run.values()]
                cell["per_seed"] = [p["accuracy"] for p in seeds if "accuracy" in p]
            out[label][length] = cell
    return out


def _times_l(n: int, train_len) -> str:
    return f"{n} ({n / train_len:g}×L)" if train_len else str(n)


def _table(heads: list[str], tables: dict[str, dict[str, dict[int, dict]]], lengths: list[int], cell) -> str:
    """One row per (table, label) with ``cell(label's cell or None)`` per length; a table's name,
    where there are several, in the first column. L: eval/tables.py's length_table."""
    rows = []
    for name, table in tables.items():
        for label in sorted(table, key=label_order):
            row_len = next((c["train_len"] for c in table[label].values() if "train_len" in c), None)
            rows.append(([name, label] if len(heads) > 1 else [label], row_len,
                         [cell(table[label].get(n)) for n in lengths]))
    return length_table(heads, lengths, rows, mark=_times_l)


def _accuracy_cell(c: Optional[dict]) -> str:
    return ("–" if c is None else f"n/a ({c['na']})" if "na" in c
            else f"{c['accuracy']:.2f} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]")


def _seeds_cell(c: Optional[dict]) -> str:
    seeds = (c or {}).get("per_seed")
    return "–" if not seeds else " / ".join(f"{a:.2f}" for a in seeds)


def accuracy_table(table: dict[str, dict[int, dict]], lengths: list[int]) -> str:
    return _table(["row"], {"": table}, lengths, _accuracy_cell)


def spread_table(table: dict[str, dict[int, dict]], lengths: list[int]) -> str:
    return _table(["row"], {"": table}, lengths, _seeds_cell)


def heatmap_grids(runs: list[dict], rows: list[dict]) -> dict[str, tuple[list[float], list[int], np.ndarray]]:
    """label -> (depths, lengths, pooled accuracy (depths × lengths), NaN for n/a)."""
    passkey = [r for r in rows if r["task"] == "passkey"]
    labels = label_rows(runs, passkey)
    cells: dict[str, dict[tuple[float, int], list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in passkey:
        cells[row_name(labels, r)][(r["depth"], r["length"])].append(r)
    grids = {}
    for label, by_cell in cells.items():
        depths = sorted({d for d, _ in by_cell})
        lengths = sorted({n for _, n in by_cell})
        acc = np.full((len(depths), len(lengths)), np.nan)
        for (d, n), group in by_cell.items():
            acc[depths.index(d), lengths.index(n)] = pooled(group).get("accuracy", np.nan)
        grids[label] = (depths, lengths, acc)
    return grids


def kmax_table(runs: list[dict], rows: list[dict], kmax_rows: list[dict]) -> list[str]:
    labels = label_rows(runs, [r for r in rows if r["task"] == "passkey"])
    seeds = {r["run"]: r["seed"] for r in runs}
    by_label: dict[str, list[str]] = defaultdict(list)
    for k in kmax_rows:
        value = "< shortest" if k["kmax"] is None else str(k["kmax"])
        by_label[row_name(labels, k)].append(f"{value} (seed {seeds[k['run']]})")
    return ["| row | k_max per run |", "|---|---|"] + [f"| {label} | {', '.join(by_label[label])} |"
                                                    for label in sorted(by_label, key=label_order)]


def summary_table(tables: dict[str, dict[str, dict[int, dict]]], lengths: list[int]) -> str:
    """Every task's rows in one table (task, row, a cell per length)."""
    return _table(["task", "row"], tables, lengths, _accuracy_cell)


def _runs_table(results: dict) -> list[str]:
    out = ["| run | encoding | trained on | seed | params | tokens trained | train length | commit |",
           "|---|---|---|---:|---:|---:|---:|---|"]
    for run in results["runs"]:
        out.append(f"| {run['name']} | {run['encoding']} | {run.get('trained_on', '')} | {run['seed']} | "
                   f"{run['params']:,} | {(run['tokens_trained'] or 0):,} | {run['train_len']} | "
                   f"{(run['git_commit'] or '')[:10]} |")
    return out


def write_task_report(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    runs, rows = results["runs"], results["results"]
    lengths = sorted({r["length"] for r in rows})
    remade = (f", made again {results['remade']} from its results.json (python -m eval.remake)"
              if results.get("remade") else "")
    md = ["# Task accuracy report", "", f"Created {results['created']}{remade}. Training length L = "
          f"{', '.join(map(str, sorted({r['train_len'] for r in runs})))}. A cell is the exact-match accuracy "
          "(an instance counts only if every answer token is the model's most likely next token; "
          "eval/exact_match.py) pooled over the seeds of a row (and, for passkey, over key depths), "
          "with its 95% interval in brackets: the wider of the Wilson interval of the pooled instances and a "
          "t-interval across training runs (the spread of the seeds' accuracies, plus the instances' binomial "
          "variance, Satterthwaite's degrees of freedom; eval/stats.py: accuracy_estimate), so seeds that "
          "disagree (a task learned by one seed, not another) widen it; one seed gets the Wilson interval "
          "alone, which says nothing about other training runs.", "", "## Runs", "", *_runs_table(results)]
    if results.get("missing"):
        md += ["", "**Missing runs** (not in the tables):", ""] + [f"- {m['run']}: {m['error']}" for m in results["missing"]]
    tasks = sorted({r["task"] for r in rows}, key=TASK_NAMES.index)
    tables = {task: summarize(runs, rows, task) for task in tasks}
    md += ["", "## Summary", "", summary_table(tables, lengths)]
    for task, table in tables.items():
        per_cell = sorted({r["total"] for r in rows if r["task"] == task and r["status"] == "ok"})
        md += ["", f"## {task}", "", accuracy_table(table, lengths), "",
               f"Instances per run and cell: {', '.join(map(str, per_cell))}"
               + (" (per depth)" if task == "passkey" else "") + ".", "",
               "Per-seed accuracy (one value per run of the row):", "", spread_table(table, lengths),
               "", f"![{task} accuracy vs length](accuracy_{task}.png)"]
        train_lens = sorted({c["train_len"] for cells in table.values() for c in cells.values()})
        plot_accuracy(table, train_lens, out / f"accuracy_{task}.png", f"{task}: exact-match accuracy")
    if results.get("kmax"):
        plot_heatmaps(heatmap_grids(runs, rows), out / "passkey_heatmap.png")
        definition = KMAX_DOC.split("\n\n")[1:4]
        k = results["kmax"][0]
        depths = sorted({r["depth"] for r in rows if r["task"] == "passkey"})
        md += ["", "## Passkey: depth × length and k_max", "", "![passkey heatmaps](passkey_heatmap.png)", "",
               *[line for part in definition for line in
                 (part if part.startswith("    ") else " ".join(x.strip() for x in part.splitlines()), "")],
               f"Here: threshold {k['threshold']:g}, {k['samples']} prompts per (length, depth) cell, depths "
               f"{', '.join(f'{d:g}' for d in depths)}, lengths {', '.join(map(str, lengths))}.", "",
               *kmax_table(runs, rows, results["kmax"])]
    (out / "report.md").write_text("\n".join(md) + "\n")
