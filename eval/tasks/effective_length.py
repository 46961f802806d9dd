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
model that never found the needle is not said to keep the task to every length.

An effective length is known only on the grid of evaluated lengths: a seed's value e means
it keeps the task at e and not at the next evaluated length, so its true limit lies between
the two. A row is therefore reported as the grid values its seeds' effective lengths fall
between, with every seed's own value beside them ("256–512; seeds 512, 512, 512, 256"), never
as a mean of grid values (a geometric mean of 512, 512, 512 and 256 is 431, a length no seed
was measured at and no seed has). A seed that keeps the task to the longest evaluated length
reads "≥ longest" (its limit is only known to be beyond); a seed at or below chance at R has
none ("–"). Fine-tunes of several parents list every run, in run order (a list of values needs
no weights; the intervals of eval/reporting/stats.py count each parent once).

Passkey's own limit, k_max (Chen et al. 2023), is here too (``k_max``, ``K_MAX_DOC``).
"""

from __future__ import annotations

from typing import Iterable, Optional

from ropelab.eval.reporting.labels import label_order


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
                         fraction: float, chance: float = 0.0) -> Optional[dict]:
    """{per_seed, seeds, censored, longest, reference, chance} of one row from its seeds' curves
    (``per_seed``: each seed's effective length, None where it is at or below chance at the
    reference length), or None where the reference length was not scored."""
    if not seed_curves or any(reference not in c for c in seed_curves):
        return None
    lengths = sorted(set.intersection(*(set(c) for c in seed_curves)))
    seeds = [effective_length(c, reference, fraction, chance) for c in seed_curves]
    longest = max(lengths)
    return {"per_seed": seeds, "seeds": len(seeds), "censored": sum(s == longest for s in seeds),
            "longest": longest, "reference": reference, "chance": chance}


def _value(n: int, longest: int) -> str:
    return f"≥ {n}" if n == longest else str(n)


def effective_text(found: Optional[dict]) -> str:
    """The grid values a row's seeds' effective lengths fall between (multiples of R), then
    every seed's own value."""
    if found is None:
        return "– (reference length not scored)"
    values, ref, longest = found["per_seed"], found["reference"], found["longest"]
    kept = [v for v in values if v is not None]
    if not kept:
        return (f"– (at or below chance, {found['chance']:.3g}, at the reference length)" if found.get("chance")
                else "– (0 at the reference length)")
    low, high = min(kept), max(kept)
    span = (f"{_value(low, longest)} (×{low / ref:g})" if low == high else
            f"{low}–{_value(high, longest)} (×{low / ref:g}–×{high / ref:g})")
    if len(values) == 1:
        return f"{span}; one seed"
    return f"{span}; seeds " + ", ".join("–" if v is None else _value(v, longest) for v in values)


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
        found = row_effective_length(seed_curves(kept[label], accuracy), first["reference"], first["fraction"], chance)
        lines.append(f"| {label} | {first['reference']} | {effective_text(found)} |")
    if not lines:
        return []
    fractions = fractions or {v["fraction"] for v in settings.values() if "fraction" in v}  # no row learned it
    fraction = "/".join(f"{f:g}" for f in sorted(fractions)) or "f"
    above = "/".join(f"{c:.3g}" for c in sorted(chances))
    chance = ("" if not any(chances) else
              f", both taken above the task's chance c = {above} (a random one of the candidate answers its prompt "
              "offers: accuracy(n) − c ≥ f × (accuracy(R) − c))")
    return ["", "Effective length: the longest evaluated length up to which a seed's accuracy stays at least "
            f"{fraction} × its accuracy at the reference length R{chance} (every evaluated length between counts; "
            "eval/tasks/effective_length.py, after RULER's effective length, Hsieh et al. 2024), for each seed that "
            "learned the task. Known only on the grid of evaluated lengths (a seed's true limit lies below the next "
            "evaluated length), a row gives the grid values its seeds fall between and each seed's own value, in "
            "seed order (≥: kept to the longest evaluated length; –: at or below chance at R):", "",
            "| row | R | effective length: grid values; each seed |", "|---|---:|---|", *lines]


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
