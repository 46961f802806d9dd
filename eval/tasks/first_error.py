"""Where along the answer the first error falls: exact match says only that an instance
failed, not where.

Each scored instance records how many of its answer tokens are right before the first
wrong one (training/exact_match.py: ``first_errors``; all of them where it is right). The
report gives, per row and length, pooled over the seeds that learned the task:

- the mean share of the answer right before its first error (1.00: every instance right);
- a heatmap per row of where the first error falls, each length's column summing to 1 with
  "none" for the instances with no error. Where the answer grows with the length (copy,
  addition: the task's ``per_position``) the bins are multiples of the answer's length at
  the reference length R (m_R answer tokens: half the length for copy, a quarter for
  aligned addition): [0, ¼), [¼, ½), [½, 1), [1, 2), [2, 4) … × m_R. A model that has
  learned to copy only as far as it was trained fails in the [1, 2) bin at every length
  past R; one that loses its place early fails in the first bins. Where the answer keeps
  its length (the retrieval tasks) the bins are the answer's tokens, 1 to m (past 12
  tokens: the first, then 11 equal groups of the rest): an error at the first token is an
  answer wrong from its start, for a retrieval task the wrong needle or chain picked, or
  none (the candidates' first tokens seldom agree), one later in the answer a pick that was
  right, or lucky, and then copied wrong.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ropelab.data.tasks import TASKS
from ropelab.eval.reporting.labels import label_order
from ropelab.eval.tasks.plots import plot_heatmaps

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


def first_error_grid(per_run: dict[str, dict[int, list[dict]]], reference: int, grows: bool = True):
    """(bin names, lengths, shares (bins × lengths)) of one row, or None without the reference
    length; ``grows``: bins in multiples of m_R, else one per answer token (see the module)."""
    lengths = sorted({n for by_length in per_run.values() for n in by_length})
    _, at_r = instances(per_run, reference)
    if not len(at_r):
        return None
    scored = {n: instances(per_run, n) for n in lengths}
    scored = {n: v for n, v in scored.items() if len(v[0])}
    longest = max(a.max() for _, a in scored.values())
    if grows:
        unit = float(at_r.max())  # m_R: answer tokens at the reference length
        cuts = edges(longest / unit)
        names = [f"[{_edge(a)}, {_edge(b)})" for a, b in zip(cuts[:-1], cuts[1:])]
    else:
        unit, cuts = 1.0, token_edges(int(longest))
        names = [f"{a + 1:g}" if b - a == 1 else f"{a + 1:g}–{b:g}" for a, b in zip(cuts[:-1], cuts[1:])]
    grid = np.full((len(names) + 1, len(lengths)), np.nan)
    for j, n in enumerate(lengths):
        if n not in scored:
            continue
        first, answer = scored[n]
        wrong = first < answer
        counts, _ = np.histogram(first[wrong] / unit, bins=cuts)
        grid[:, j] = np.append(counts, (~wrong).sum()) / len(first)
    return names + ["none"], lengths, grid


def token_edges(tokens: int, most: int = 12) -> list[float]:
    """Bin edges over answer tokens 0 … ``tokens`` − 1 (right before the first error): one bin
    per token up to ``most`` tokens, else the first token, then ``most`` − 1 equal groups."""
    if tokens <= most:
        return [float(k) for k in range(tokens + 1)]
    width = math.ceil((tokens - 1) / (most - 1))
    return [0.0, *(float(k) for k in range(1, tokens, width)), float(tokens)]


def learned_or_every(kept: Kept, everyone: Kept) -> dict[str, tuple[str, dict[str, dict[int, list[dict]]]]]:
    """label -> (its name in a table, its runs): the seeds that learned the task (``kept``), or
    where none did, all of its seeds (``everyone``), marked, since where a model that never
    learned a task fails tells why."""
    shown = {}
    for label, per_run in everyone.items():
        if kept.get(label):
            shown[label] = (label, kept[label])
        else:
            shown[label] = (f"{label} (not learned: {len(per_run)} seed{'s' if len(per_run) > 1 else ''})", per_run)
    return shown


def positions_section(task: str, kept: Kept, settings: dict[str, dict], out: Path, everyone: Kept) -> list[str]:
    """The report's first-error table and heatmaps for one task (nothing for tasks without them),
    over the seeds ``learned_or_every`` picks."""
    shown = learned_or_every(kept, everyone)
    rows = {label: per_run for label, (_, per_run) in shown.items() if per_run and any(
        "first_error" in c for by_length in per_run.values() for cells in by_length.values() for c in cells)}
    named = {label: shown[label][0] for label in rows}
    if not rows:
        return []
    lengths = sorted({n for per_run in rows.values() for by_length in per_run.values() for n in by_length})
    grows = TASKS[task].per_position
    lines, grids = [], {}
    for label in sorted(rows, key=label_order):
        shares = []
        for n in lengths:
            first, answer = instances(rows[label], n)
            shares.append(f"{np.mean(first / answer):.2f}" if len(first) else "–")
        lines.append(f"| {named[label]} | " + " | ".join(shares) + " |")
        grid = first_error_grid(rows[label], settings[next(iter(rows[label]))]["reference"], grows)
        if grid is not None:
            grids[named[label]] = grid
    plot = f"{task}_first_error.png"
    if grids:
        plot_heatmaps(grids, out / plot, f"{task}: where the first error falls (seeds that learned it, else all)",
                      ylabel="first error at (× answer length at R)" if grows else "first error at answer token",
                      scale="share of instances")
    bins = ("in multiples of the answer's length at R" if grows else
            "at which of the answer's tokens (1: wrong from its start, the wrong candidate picked or none)")
    return ["", f"Where the first error falls ({task}; eval/tasks/first_error.py): the mean share of the answer right "
            "before its first error, over the instances of the seeds that learned the task, or of every seed where "
            "none did (marked \"not learned\"; 1.00: no error); the "
            f"heatmaps give the share of instances whose first error falls {bins}, \"none\" for those right:", "",
            "| row | " + " | ".join(map(str, lengths)) + " |", "|---|" + "---:|" * len(lengths), *lines,
            *(["", f"![{task}: where the first error falls]({plot})"] if grids else [])]
