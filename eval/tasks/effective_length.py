"""Effective length: how far past its reference length a row keeps doing a task.

After RULER (Hsieh et al. 2024, §4), whose effective length is the longest length at which a
model's score stays above a fixed threshold (Llama-2-7B's at 4K, 85.6%), but relative to
the row's own accuracy, so that rows that learned a task to different levels compare on
how long they keep it:

    effective length = the longest evaluated length n ≥ R such that at every evaluated
                       length n' with R ≤ n' ≤ n the accuracy is at least f × the accuracy
                       at R,

where R is the reference length (``eval.tasks.reference_length``, by default the run's
training length L) and f is ``eval.tasks.effective_fraction`` (default 0.8). A length the
encoding cannot serve (a learned table's end) counts as failing; a curve at 0 at R has none
(it never did the task). Where a task offers a few candidate answers (a passkey among
distractors, one of several needles or chains), the accuracy of a model that picks one at
random, the task's chance c (data/tasks: ``Task.chance``), is taken off first: n counts
while accuracy(n) − c ≥ f × (accuracy(R) − c), and a curve at or below c at R has none, so a
model that never found the needle is not said to keep the task to every length. Where at
least two seeds pool and each has a value short of the longest evaluated length, the row's
value is the geometric mean of the seeds' own effective lengths and its 95% interval a
t-interval around it on log2 length (S − 1 degrees of freedom, as the breakdown length of
perplexity reports, eval/lm/context_use.py; fine-tunes of several parents: the parents' means on
C − 1, eval/reporting/stats.py), cut to [R, the longest evaluated length] where an
effective length lies, so the value always lies inside its interval. Where every seed (every
parent's mean) has the same value, the row says they agree instead: a t-interval of width 0
would claim a certainty that lengths a factor 2 apart cannot give.
Otherwise (one seed; a seed that keeps the task to the longest length, whose true value is
only known to be at least that; a seed at 0 at R) the value comes from the pooled curve
(the mean accuracy over the seeds), with no interval, and the row says why. With lengths a factor
2 apart, each seed's value is only known to lie below the next evaluated length.

Passkey's own limit, k_max (Chen et al. 2023), is here too (``k_max``, ``K_MAX_DOC``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ropelab.eval.reporting.intervals import length_interval
from ropelab.eval.reporting.labels import label_order
from ropelab.eval.reporting.stats import unit_weights


def effective_length(curve: dict[int, Optional[float]], reference: int, fraction: float,
                     chance: float = 0.0) -> Optional[int]:
    """The effective length of an accuracy curve {length: accuracy, None where not served};
    None where the accuracy at the reference length is at or below ``chance`` (0: never did the
    task), missing or not served."""
    base = curve.get(reference)
    if base is None or base <= chance:
        return None
    best = reference
    for n in sorted(n for n in curve if n > reference):
        if curve[n] is None or curve[n] - chance < fraction * (base - chance):
            break
        best = n
    return best


def row_effective_length(seed_curves: list[dict[int, Optional[float]]], reference: int,
                         fraction: float, chance: float = 0.0, units: Sequence[str] = ()) -> Optional[dict]:
    """{point, low, high, seeds, censored, longest, reference, per_seed} of one row from its
    seeds' curves (point None where the row is at 0 at the reference length), or None where the
    reference length was not scored. ``units``: each curve's replicate unit (eval/reporting/stats.py:
    fine-tunes of several parents count each parent once)."""
    if not seed_curves or any(reference not in c for c in seed_curves):
        return None
    lengths = sorted(set.intersection(*(set(c) for c in seed_curves)))
    weights = unit_weights(len(seed_curves), units)
    pooled = {n: (None if any(c[n] is None for c in seed_curves)
                  else float(weights @ np.array([c[n] for c in seed_curves]))) for n in lengths}
    seeds = [effective_length(c, reference, fraction, chance) for c in seed_curves]
    longest = max(lengths)
    out = {"point": effective_length(pooled, reference, fraction, chance), "low": None, "high": None,
           "seeds": len(seeds), "censored": sum(s == longest for s in seeds), "longest": longest,
           "reference": reference, "per_seed": seeds, "chance": chance}
    if len(seeds) >= 2 and out["censored"] == 0 and None not in seeds:
        point, low, high, replicates = length_interval(seeds, units)
        if low is None:  # every seed (parent) at one value: no interval
            out.update(point=point, agree=replicates, of="parents" if replicates < len(seeds) else "seeds")
            return out
        # An effective length is an evaluated length from the reference to the longest, so the
        # interval is cut to that range: the truth is in it, so the coverage holds.
        out.update(point=point, low=max(low, reference), high=min(high, longest))
    return out


def effective_text(found: Optional[dict]) -> str:
    if found is None:
        return "– (reference length not scored)"
    point, ref = found["point"], found["reference"]
    if point is None:
        return (f"– (at or below chance, {found['chance']:.3g}, at the reference length)" if found.get("chance")
                else "– (0 at the reference length)")
    text = f"{point:.0f} (×{point / ref:.3g})"
    if found["censored"]:
        return f"≥ {text}; {found['censored']} of {found['seeds']} seeds keep it to the longest length"
    if found["low"] is not None:
        return f"{text} ({found['low']:.0f}–{found['high']:.0f})"
    if found.get("agree"):
        return f"{text}; the {found['agree']} {found['of']} agree: no spread to make an interval from"
    if None in found["per_seed"]:
        at = "at or below chance" if found.get("chance") else "at 0"
        return f"{text}; {found['per_seed'].count(None)} of {found['seeds']} seeds {at} at the reference length"
    return f"{text} (one seed)"


def seed_curves(per_run: dict[str, dict[int, list[dict]]], accuracy) -> list[dict[int, Optional[float]]]:
    """Each seed's accuracy curve {length: accuracy pooled over depths, None where not served}."""
    return [{n: accuracy(cells) for n, cells in by_length.items()} for _, by_length in sorted(per_run.items())]


def effective_section(kept: dict[str, dict[str, dict[int, list[dict]]]], settings: dict[str, dict],
                      accuracy, task: str) -> list[str]:
    """The report's effective-length table of ``task``: a line per row, from the seeds it pools
    (``kept``: label -> run -> length -> cells; ``settings``: run -> {reference, fraction,
    chance: {task: c}}; ``accuracy``: cells -> a seed's accuracy or None)."""
    lines, fractions, chances = [], set(), set()
    for label in sorted(kept, key=label_order):
        if not kept[label]:
            lines.append(f"| {label} | – | – (no seed learned the task) |")
            continue
        first = settings[next(iter(kept[label]))]
        fractions.add(first["fraction"])
        chance = (first.get("chance") or {}).get(task, 0.0)
        chances.add(chance)
        units = tuple(settings[run].get("unit", run) for run in sorted(kept[label]))
        found = row_effective_length(seed_curves(kept[label], accuracy), first["reference"], first["fraction"], chance,
                                     units)
        lines.append(f"| {label} | {first['reference']} | {effective_text(found)} |")
    if not lines:
        return []
    fractions = fractions or {v["fraction"] for v in settings.values() if "fraction" in v}  # no row learned it
    fraction = "/".join(f"{f:g}" for f in sorted(fractions)) or "f"
    above = "/".join(f"{c:.3g}" for c in sorted(chances))
    chance = ("" if not any(chances) else
              f", both taken above the task's chance c = {above} (a random one of the candidate answers its prompt "
              "offers: accuracy(n) − c ≥ f × (accuracy(R) − c))")
    return ["", "Effective length: the longest evaluated length up to which the row's accuracy stays at least "
            f"{fraction} × its accuracy at the reference length R{chance} (every evaluated length between counts; "
            "eval/tasks/effective_length.py, after RULER's effective length, Hsieh et al. 2024), from the seeds that "
            "learned the task: the geometric mean of their own effective lengths with a 95% t-interval (log2 length, "
            "cut to [R, the longest evaluated length]; none where the seeds, or the parents, all agree), "
            "or, where a seed keeps the task to the longest length, a seed is at or below chance at R or only one "
            "pools, that of their mean accuracy curve:", "",
            "| row | R | effective length (95% interval) |", "|---|---:|---|", *lines]


# --------------------------------------------------------------- k_max

K_MAX_DOC = """k_max: the longest length at which passkey retrieval succeeds at every depth.

Chen et al. 2023 (position interpolation, §3.3) place a 5-digit passkey k tokens before
the end, try 10 random keys per k, and define k_max as the largest k such that the model
retrieves the key in at least 20% of the tries at every k' <= k. Here a prompt of length n
holds the key at each of the evaluated depths (depth 0 puts it about n tokens before
the question, depth 1 right before it), so:

    k_max = the largest evaluated length n such that, at every evaluated length n' <= n
            and every evaluated depth, the exact-match accuracy over ``eval.tasks.samples``
            prompts is at least ``eval.tasks.kmax_threshold`` (default 0.2, Chen et al.'s).

A length the encoding cannot serve (a learned table's end) counts as failing. k_max is
None when retrieval already fails at the shortest evaluated length. With lengths a
factor 2 apart, the true limit lies between k_max and the next evaluated length.
"""


def k_max(cells: Iterable[dict], threshold: float) -> Optional[int]:
    """k_max from passkey cells ``{"length", "depth", "status", "correct", "total"}`` of one
    run and scaling (cells with another status than "ok" fail)."""
    by_length: dict[int, list[dict]] = {}
    for cell in cells:
        by_length.setdefault(cell["length"], []).append(cell)
    best = None
    for length in sorted(by_length):
        ok = all(c["status"] == "ok" and c["correct"] >= threshold * c["total"] for c in by_length[length])
        if not ok:
            break
        best = length
    return best
