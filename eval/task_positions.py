"""Where along the answer the first error falls, for tasks whose answer grows with the length
(copy, addition): exact match says only that an instance failed, not where.

Each scored instance records how many of its answer tokens are right before the first
wrong one (training/exact_match.py: ``first_errors``; all of them where it is right). The
report gives, per row and length, pooled over the seeds that learned the task:

- the mean share of the answer right before its first error (1.0: every instance right);
- a heatmap per row of where the first error falls, in multiples of the answer's length at
  the reference length R (m_R answer tokens: half the length for copy, a quarter for
  aligned addition): [0, ¼), [¼, ½), [½, 1), [1, 2), [2, 4) … × m_R, and "none" for
  instances with no error; each length's column sums to 1. A model that has learned to copy
  only as far as it was trained fails in the [1, 2) bin at every length past R; one that
  loses its place early fails in the first bins.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from eval.labels import label_order
from eval.task_plots import plot_heatmaps

Kept = dict[str, dict[str, dict[int, list[dict]]]]  # label -> run -> length -> cells


def instances(per_run: dict[str, dict[int, list[dict]]], length: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens right before the first error, answer tokens) of every instance a row scored at ``length``."""
    cells = [c for by_length in per_run.values() for c in by_length.get(length, []) if "first_error" in c]
    if not cells:
        return np.zeros(0), np.zeros(0)
    return (np.concatenate([c["first_error"] for c in cells]).astype(float),
            np.concatenate([c["answer_tokens"] for c in cells]).astype(float))


def edges(longest: float) -> list[float]:
    """Bin edges in multiples of m_R: ¼, ½, then powers of 2 up past ``longest``."""
    top = max(1, math.ceil(math.log2(max(longest, 1.0)))) + 1
    return [0.0, 0.25, 0.5, *(2.0 ** k for k in range(top))]


def _edge(x: float) -> str:
    return {0.25: "¼", 0.5: "½"}.get(x, f"{x:g}")


def first_error_grid(per_run: dict[str, dict[int, list[dict]]], reference: int):
    """(bin names, lengths, shares (bins × lengths)) of one row, or None without the reference length."""
    lengths = sorted({n for by_length in per_run.values() for n in by_length})
    _, at_r = instances(per_run, reference)
    if not len(at_r):
        return None
    unit = float(at_r.max())  # m_R: answer tokens at the reference length
    scored = {n: instances(per_run, n) for n in lengths}
    scored = {n: v for n, v in scored.items() if len(v[0])}
    cuts = edges(max(a.max() for _, a in scored.values()) / unit)
    names = [f"[{_edge(a)}, {_edge(b)})" for a, b in zip(cuts[:-1], cuts[1:])] + ["none"]
    grid = np.full((len(names), len(lengths)), np.nan)
    for j, n in enumerate(lengths):
        if n not in scored:
            continue
        first, answer = scored[n]
        wrong = first < answer
        counts, _ = np.histogram(first[wrong] / unit, bins=cuts)
        grid[:, j] = np.append(counts, (~wrong).sum()) / len(first)
    return names, lengths, grid


def positions_section(task: str, kept: Kept, settings: dict[str, dict], out: Path) -> list[str]:
    """The report's first-error table and heatmaps for one task (nothing for tasks without them)."""
    rows = {label: per_run for label, per_run in kept.items() if per_run and any(
        "first_error" in c for by_length in per_run.values() for cells in by_length.values() for c in cells)}
    if not rows:
        return []
    lengths = sorted({n for per_run in rows.values() for by_length in per_run.values() for n in by_length})
    lines, grids = [], {}
    for label in sorted(rows, key=label_order):
        shares = []
        for n in lengths:
            first, answer = instances(rows[label], n)
            shares.append(f"{np.mean(first / answer):.2f}" if len(first) else "–")
        lines.append(f"| {label} | " + " | ".join(shares) + " |")
        grid = first_error_grid(rows[label], settings[next(iter(rows[label]))]["reference"])
        if grid is not None:
            grids[label] = grid
    plot = f"{task}_first_error.png"
    if grids:
        plot_heatmaps(grids, out / plot, f"{task}: where the first error falls (seeds that learned it)",
                      ylabel="first error at (× answer length at R)", scale="share of instances")
    return ["", f"Where the first error falls ({task}; eval/task_positions.py): the mean share of the answer right "
            "before its first error, over the instances of the seeds that learned the task (1.00: no error):", "",
            "| row | " + " | ".join(map(str, lengths)) + " |", "|---|" + "---:|" * len(lengths), *lines,
            *(["", f"![{task}: where the first error falls]({plot})"] if grids else [])]
