"""How each seed learned its task: accuracy at L at every competence check, drawn per row.

A run trained with ``train.stop_at_accuracy`` scores its fixed validation instances at L at
every check (training/competence.py) and its metrics.jsonl keeps each check's accuracy; the
report's run meta carries them (``competence_curve``). The runs table condenses a run to its
stop, or its end and the check four fifths of the way there; the figure shows the whole
path: a plateau (at multikey's chance of 0.25, say: one of four needles' values copied without
knowing which was asked) before a rise, and a run whose budget ends on the way up beside one
long stalled.
Results written before the curves were recorded have none, and their report has no figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ropelab.eval.tasks.depth import seed_of
from ropelab.eval.tasks.plots import plot_learning
from ropelab.eval.tasks.first_error import Kept

Curves = dict[str, dict[int, tuple[list[int], list[float]]]]  # label -> seed -> (steps, accuracies)


def learning_curves(task: str, everyone: Kept, meta: dict[str, dict]) -> tuple[Curves, Optional[float]]:
    """Each row's seeds' accuracy at L on ``task`` at every check, and the stop's threshold
    (the highest of the runs', where they differ); rows without a curve are left out."""
    curves: Curves = {}
    thresholds = []
    for label, runs in everyone.items():
        for run, by_length in runs.items():
            curve = meta[run].get("competence_curve") or {}
            accuracy = (curve.get("accuracy") or {}).get(task)
            if not accuracy:
                continue
            curves.setdefault(label, {})[seed_of(by_length)] = (list(curve["steps"]), list(accuracy))
            thresholds.append((meta[run].get("competence") or {}).get("threshold"))
    known = [t for t in thresholds if isinstance(t, (int, float))]
    return curves, max(known) if known else None


def learning_section(task: str, everyone: Kept, meta: dict[str, dict], out: Path) -> list[str]:
    """The figure of ``task``'s learning curves and what it shows; nothing without curves."""
    curves, threshold = learning_curves(task, everyone, meta)
    if not curves:
        return []
    name = f"{task}_learning.png"
    plot_learning(curves, threshold if threshold is not None else 1.0, out / name,
                  f"{task}: accuracy at L during training")
    stop = f" (dashed: the stop's threshold, {threshold:g})" if threshold is not None else ""
    return ["", f"![{task}: accuracy at L during training]({name})", "",
            f"Accuracy at L on the run's fixed validation instances at each check during training, a panel "
            f"per row and a line per seed{stop}. A line that ends early stopped at competence; one that runs to "
            "its budget's end did not, and its last stretch says whether it was still rising or had stalled."]
