"""The needle's part of the attention diagnostics' report (passkey, multikey): the mean mass
on the asked needle, each run's retrieval head pooled per row, the same head at the first
answer query alone, by the needle's depth, and run by run. eval/diagnostics/report.py pools
the rows (each run's own retrieval head: heads are not aligned across seeds) and calls
``needle_section``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ropelab.eval.diagnostics.plots import plot_needle
from ropelab.eval.diagnostics.tables import cell_text, header, table


def needle_section(rows: list[dict], lengths: list[int], out: Path) -> list[str]:
    found = [r for r in rows if any("needle" in c for c in r["lengths"].values())]
    if not found:
        return []
    plot_needle(found, out / "needle_mass.png")
    lines = ["", "## Attention on the needle (passkey, multikey)", "",
             "The mean attention mass on the needle's tokens (the key, or the asked needles' values) from the queries "
             "that predict the answer, over layers and heads; below, what uniform attention would put there.", "",
             *table(found, lengths, "needle", ".3f")]
    lines += ["", "| uniform attention | " + " | ".join(str(n) for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
    for row in found:
        lines.append(f"| {row['label']} | " + " | ".join("–" if row["uniform"].get(n) is None
                                                         else f"{row['uniform'][n]:.3f}" for n in lengths) + " |")
    lines += ["", "The retrieval head: each run's head with the most attention on the needle at the shortest length "
                  "where its needle was measured, followed to the longer lengths (heads are not aligned across seeds, "
                  "so each run's own head is pooled, not one head index):", "", *table(found, lengths, "needle_top", ".3f")]
    return (lines + _first_query_table(found, lengths) + _depth_table(found, lengths) + _per_run_table(found, lengths)
            + ["", "![needle mass against length](needle_mass.png)"])


def _first_query_table(rows: list[dict], lengths: list[int]) -> list[str]:
    """The retrieval head's mass from the first answer query alone, where caches measured it."""
    found = [r for r in rows if any("needle_first_top" in r["lengths"].get(n, {}) for n in lengths)]
    if not found:
        return []
    lines = ["", "The same head from the first answer query alone: it predicts the answer's first token with none "
                 "of the answer in the context yet, so this is where the needle is chosen; the queries after it "
                 "see the asked value's first tokens and may find the needle by them, which the means above "
                 "include:", "", *table(found, lengths, "needle_first_top", ".3f")]
    measured = {r["label"] for r in found}
    older = [r["label"] for r in rows if r["label"] not in measured]
    if older:
        lines += ["", "Not measured (diagnostics cached before the first-query measure existed): "
                      + ", ".join(f"`{label}`" for label in older) + "."]
    return lines


def _per_run_table(rows: list[dict], lengths: list[int]) -> list[str]:
    """Each run's retrieval head (``_retrieval_head_per_run``), one line per run."""
    found = [r for r in rows if r.get("needle_top_runs")]
    if not found:
        return []
    lines = ["", "The retrieval head of each run: its mean mass on the needle over the run's windows, in "
                 "parentheses over those with the needle farthest from the question (its smallest depth), and "
                 "after the slash from the first answer query alone (where the diagnostics measured it). The "
                 "rows above pool every seed of a row, those that learned the task and those that did not (the "
                 "task report says which did); here they stand apart:", "",
             *header(["row", "run"], ["seed"], found[0]["train_len"], lengths)]
    for row in found:
        for name, run in row["needle_top_runs"].items():
            cells = (_head_cell(run["lengths"].get(n)) for n in lengths)
            lines.append(f"| {row['label']} | {name} | {run['seed']} | " + " | ".join(cells) + " |")
    return lines


def _head_cell(value: Optional[tuple]) -> str:
    """One run's retrieval head at one length: its mean, (the farthest needle's) and / the first
    answer query's, each where known."""
    if value is None:
        return "–"
    mean, far, first = value
    return f"{mean:.2f}" + ("" if far is None else f" ({far[1]:.2f})") + ("" if first is None else f" / {first:.2f}")


def _depth_table(rows: list[dict], lengths: list[int]) -> list[str]:
    """The retrieval head's needle mass per depth (rows × depth, one column per length)."""
    found = [r for r in rows if r.get("needle_depth")]
    if not found:
        return []
    lines = ["", "The retrieval head's mass on the needle by its depth (0: the needle opens the filler; 1: it "
                 "stands right before the question; a value without an interval is one window's):", "",
             *header(["row"], ["depth"], found[0]["train_len"], lengths)]
    for row in found:
        for d in sorted({d for by_depth in row["needle_depth"].values() for d in by_depth}):
            cells = (cell_text(row["needle_depth"].get(n, {}).get(d), ".3f") for n in lengths)
            lines.append(f"| {row['label']} | {d:g} | " + " | ".join(cells) + " |")
    return lines
