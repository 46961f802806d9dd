"""Where a seed that did not learn a needle task fails at the reference length: accuracy by
the needle's depth, seed by seed.

The depth × length heatmaps pool the seeds that learned the task, which are right at nearly
every depth at R by definition. A seed that did not learn it is left out of them, yet where
its errors fall at R says something the pooled accuracy cannot: failures spread over every
depth (the lookup itself missing) read differently from failures gathered at one depth.
Training draws each needle's depth uniformly in [0, 1] (docs/tasks.md) and lays it at offset
round(depth × room) of a filler with room + 1 offsets, so either end of the filler comes up in
about one training instance in 2 × room; both ends are equally rare, so where errors gather
at one end and not the other, rarity alone does not explain it.

The table gives, per row, the seeds that learned the task pooled (correct / scored over their
instances at each depth) and then every seed that did not, on its own; a section appears only
where learning was judged and some seed failed it.
"""

from __future__ import annotations

from collections import defaultdict

from ropelab.eval.reporting.labels import label_order
from ropelab.eval.tasks.first_error import Kept


def depth_counts(per_run: dict[str, dict[int, list[dict]]], settings: dict[str, dict]) -> dict[float, list[int]]:
    """depth -> [correct, scored] over the runs' cells at each run's reference length."""
    counts: dict[float, list[int]] = defaultdict(lambda: [0, 0])
    for run, by_length in per_run.items():
        for c in by_length.get(settings[run]["reference"], []):
            if c["status"] == "ok" and c.get("depth") is not None:
                counts[c["depth"]][0] += c["correct"]
                counts[c["depth"]][1] += c["total"]
    return counts


def _line(name: str, counts: dict[float, list[int]], depths: list[float]) -> str:
    correct, total = (sum(v[i] for v in counts.values()) for i in (0, 1))
    cells = [f"{counts[d][0] / counts[d][1]:.2f}" if counts.get(d, [0, 0])[1] else "–" for d in depths]
    return f"| {name} | {correct / total:.2f} | " + " | ".join(cells) + " |"


def depth_section(task: str, kept: Kept, everyone: Kept, settings: dict[str, dict]) -> list[str]:
    """The report's accuracy-by-depth table at R for one needle task (nothing where no seed was
    judged to have failed it, or the task has no depths)."""
    lines, depths = [], set()
    for label in sorted(everyone, key=label_order):
        failed = {run: by_length for run, by_length in everyone[label].items() if run not in kept.get(label, {})}
        if not failed:
            continue
        shown = []
        if kept.get(label):
            shown.append((f"{label}: {len(kept[label])} learned, pooled", depth_counts(kept[label], settings)))
        for run in sorted(failed, key=lambda r: seed_of(failed[r])):
            shown.append((f"{label}: seed {seed_of(failed[run])} (not learned)",
                          depth_counts({run: failed[run]}, settings)))
        shown = [(name, counts) for name, counts in shown if counts]
        depths.update(d for _, counts in shown for d in counts)
        lines += shown
    if not lines:  # a line is shown only with counts, so its depths are in
        return []
    order = sorted(depths)
    head = " | ".join(f"{d:g}" for d in order)
    return ["", f"Accuracy at R by the needle's depth ({task}; eval/tasks/depth.py), for the rows where a seed did not "
            "learn the task: the seeds that learned it pooled, then each seed that did not on its own, with its "
            "accuracy at R over every depth first (depth 0: the asked needle at the start of the filler, 1: right "
            "before the question; training draws depths uniformly, so either end is rare in training):", "",
            f"| seeds | at R | {head} |", "|---|---:|" + "---:|" * len(order),
            *(_line(name, counts, order) for name, counts in lines)]


def seed_of(by_length: dict[int, list[dict]]):
    """The seed of one run's cells."""
    return next(c["seed"] for cells in by_length.values() for c in cells)
