"""Which seeds' "learned" judgement their test instances cannot settle.

A seed counts as having learned a task when its accuracy at the reference length R is at
least ``eval.tasks.learned_accuracy`` (eval/tasks/report.py: learned). That accuracy is
measured on a finite set of test instances (200 for passkey and multikey at 40 per depth, 40
for a task without depths), so it is a sample of the seed's true accuracy, and the
judgement is one-sided: is that accuracy at least the threshold? A learned seed's judgement is
settled when the one-sided 95% lower Wilson bound of its accuracy is at or above the
threshold, a seed that did not learn when its upper bound is below it (Wilson 1927, with
z = 1.645; the bound a two-sided 90% interval gives). Where it is not, the instances do not
say on which side of the threshold the seed's accuracy lies: 190 of 200 right (0.95) has a
lower bound of 0.92, and even 40 of 40 one of 0.94, while 196 of 200 (0.98) settles it at
0.956. The competence stop's validation instances are another sample, which is why a run
can stop at 0.98 there and score 0.94 here.

The report gives, per row with such seeds, its learned count, the range that count spans
with every such seed judged the other way, and the seeds themselves; one sentence where
every judged seed is settled.
"""

from __future__ import annotations

from typing import Optional

from ropelab.eval.reporting.labels import label_order
from ropelab.eval.reporting.stats import wilson_interval
from ropelab.eval.tasks.depth import seed_of
from ropelab.eval.tasks.first_error import Kept

# A one-sided 95% bound is the bound on its side of the two-sided 90% interval (z = 1.645).
ONE_SIDED_95 = 0.90


def counts_at_reference(by_length: dict[int, list[dict]], reference: int) -> tuple[int, int]:
    """(correct, scored) over a run's cells at its reference length, every depth."""
    ok = [c for c in by_length.get(reference, []) if c["status"] == "ok"]
    return sum(c["correct"] for c in ok), sum(c["total"] for c in ok)


def unsettled(correct: int, scored: int, threshold: float, learned: bool) -> Optional[float]:
    """The one-sided 95% bound that fails to settle the judgement (a learned seed's lower bound
    below the threshold, another seed's upper bound at or above it), else None."""
    low, high = wilson_interval(correct, scored, level=ONE_SIDED_95)
    if learned:
        return low if low < threshold else None
    return high if high >= threshold else None


def borderline_seeds(everyone: Kept, status: dict[str, Optional[bool]], settings: dict[str, dict]) -> dict:
    """label -> (seeds learned, seeds judged, [(seed, learned, correct, scored, bound, threshold)])
    for the seeds whose judgement their instances do not settle; rows not judged are left out."""
    out = {}
    for label in sorted(everyone, key=label_order):
        judged, near = [], []
        for run, by_length in everyone[label].items():
            if status.get(run) is None:
                continue
            judged.append(status[run])
            correct, scored = counts_at_reference(by_length, settings[run]["reference"])
            threshold = settings[run]["learned_at"]
            bound = unsettled(correct, scored, threshold, status[run]) if scored else None
            if bound is not None:
                near.append((seed_of(by_length), status[run], correct, scored, bound, threshold))
        if judged:
            out[label] = (sum(judged), len(judged), sorted(near, key=lambda s: s[0]))
    return out


def _bound(x: float, threshold: float) -> str:
    """A bound to two decimals, or as many more as it takes not to print the threshold itself."""
    for digits in (2, 3, 4):
        text = f"{x:.{digits}f}"
        if float(text) != threshold:
            return text
    return text


def _seed_text(seed, learned: bool, correct: int, scored: int, bound: float, threshold: float) -> str:
    side = "lower" if learned else "upper"
    return (f"seed {seed} ({'' if learned else 'not '}learned, {correct}/{scored} = "
            f"{correct / scored:.2f}, {side} bound {_bound(bound, threshold)})")


def borderline_section(task: str, everyone: Kept, status: dict[str, Optional[bool]],
                       settings: dict[str, dict]) -> list[str]:
    """The report's lines on seeds whose learned judgement their test instances cannot settle
    (nothing where no seed's learning was judged)."""
    rows = borderline_seeds(everyone, status, settings)
    if not rows:
        return []
    thresholds = sorted({settings[run]["learned_at"] for per_run in everyone.values() for run in per_run
                         if status.get(run) is not None})
    at = " or ".join(f"{t:g}" for t in thresholds)
    head = (f"Seeds near the learned threshold ({task}; eval/tasks/borderline.py): whether a seed learned the task "
            f"(accuracy at R ≥ {at}) is judged on its test instances, and settled where the one-sided 95% Wilson "
            "bound of its accuracy lies on the same side of the threshold (a learned seed's lower bound at or "
            "above it, another seed's upper bound below it)")
    near = {label: row for label, row in rows.items() if row[2]}
    if not near:
        return ["", head + ": every judged seed is settled, so each row's learned count stands."]
    lines = ["", head + ". Where it is not, per row: the learned count, the range it spans with each such seed "
             "judged the other way, and those seeds:", "",
             "| row | seeds learned | if the unsettled seeds went the other way | unsettled seeds: judged, correct at R, bound |",
             "|---|---|---|---|"]
    for label, (learned, judged, seeds) in near.items():
        low = learned - sum(s[1] for s in seeds)  # a row here has an unsettled seed, so low < high
        high = learned + sum(not s[1] for s in seeds)
        lines.append(f"| {label} | {learned}/{judged} | {low}–{high} of {judged} | {'; '.join(_seed_text(*s) for s in seeds)} |")
    return lines
