"""The findings a task report's summary states, one sentence each, read off its own tables.

Per task: which rows no seed learned (their accuracy beyond L says nothing of their encoding),
and which rows the comparisons with the reference row (eval/tasks/compare.py, the same
correction family as the task's table) mark higher or lower at which lengths, which are
undecided at every length they were tested at, and at how many seeds. A comparison at the
floor or the ceiling is no test and is left out, as in the table.
"""

from __future__ import annotations

from typing import Optional

from ropelab.eval.reporting.labels import budget_partner, label_order
from ropelab.eval.tasks.compare import RunCells, task_comparisons


def _names(labels: list[str]) -> str:
    return ", ".join(f"`{label}`" for label in labels)


def task_findings(task: str, kept: dict[str, RunCells], counts: dict[str, tuple[int, int, bool]],
                  reference: Optional[str], meta: dict[str, dict], multiple) -> list[str]:
    """The summary's sentences for one task (``kept``, ``counts``: eval/tasks/report.py's
    ``pooled_seeds``; ``multiple(n)``: a length as a multiple of L, "2L")."""
    found = []
    unlearned = sorted((label for label, (k, _, judged) in counts.items() if judged and k == 0), key=label_order)
    if unlearned:
        found.append(f"{task}: no seed learned it in {_names(unlearned)}, so these rows have no accuracy beyond L "
                     "to compare.")
    if reference is None or len(kept) < 2 or not any(budget_partner(label, reference) in kept for label in kept):
        return found
    comparisons = task_comparisons(kept, reference, meta)
    higher, lower, undecided = [], [], []
    for name, cells in comparisons.items():
        label = name.split(" vs ")[0]
        up = [multiple(n) for n, c in sorted(cells.items()) if c["mark"] == "▲"]
        down = [multiple(n) for n, c in sorted(cells.items()) if c["mark"] == "▼"]
        tests = [c for c in cells.values() if c["mark"]]
        if up:
            higher.append(f"`{label}` ({', '.join(up)})")
        if down:
            lower.append(f"`{label}` ({', '.join(down)})")
        if tests and not up and not down:
            undecided.append(f"`{label}` (at {min(c['estimate'].seeds for c in tests)} seeds)")
    parts = ([f"higher accuracy: {', '.join(higher)}"] if higher else []) + (
        [f"lower: {', '.join(lower)}"] if lower else []) + (
        [f"undecided at every length tested: {', '.join(undecided)}"] if undecided else [])
    if parts:
        found.append(f"{task}, against `{reference}` after the correction: " + "; ".join(parts) + ".")
    return found
