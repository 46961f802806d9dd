"""The summary an attention diagnostics report opens with: one table, then one sentence per measure.

The table holds, per row, the three measures every softmax row has (entropy, attended
distance, sink mass) at the training length L and at the longest length measured, beside
what uniform causal attention would give. Each sentence reads one measure at the longest
length off the table: the rows at its two ends with their intervals, and which rows' intervals
lie wholly below uniform attention's value (a description of these rows, not a ranking: the
intervals, across seeds where a row has several, are in the table and the sections below).
"""

from __future__ import annotations

from ropelab.eval.diagnostics.tables import cell_text, uniform_distance, uniform_entropy
from ropelab.eval.reporting.labels import plan_note

MEASURES = (("entropy", "entropy (nats)", ".3f", uniform_entropy),
            ("distance", "attended distance (tokens)", ".1f", uniform_distance),
            ("sink", "sink mass", ".3f", None))


def _at(row: dict, n: int, name: str):
    return row["lengths"].get(n, {}).get(name)


def summary_section(rows: list[dict], lengths: list[int]) -> list[str]:
    """``## Summary``: the table and the findings; nothing where no row has attention weights."""
    if not rows or not lengths:
        return []
    train_len, longest = rows[0]["train_len"], lengths[-1]
    shown = [n for n in dict.fromkeys((train_len, longest)) if n in lengths]
    heads = [f"{label} at {n}" for _, label, _, _ in MEASURES for n in shown]
    table = ["| row | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    uniform = [format(ref(n), fmt) if ref else "–" for _, _, fmt, ref in MEASURES for n in shown]
    table.append("| *uniform attention* | " + " | ".join(uniform) + " |")
    for row in rows:
        table.append(f"| {row['label']} | " + " | ".join(cell_text(_at(row, n, name), fmt)
                                                     for name, _, fmt, _ in MEASURES for n in shown) + " |")
    lines = ["", "## Summary", "",
             f"Means over layers, heads and queries with their 95% intervals (across seeds where a row has several, "
             f"else across one run's windows), at L = {train_len} and at {longest}:", "", *table, ""]
    note = plan_note(row["label"] for row in rows)
    lines += [note.strip(), ""] if note else []
    return lines + [f"- {sentence}" for sentence in _findings(rows, longest)]


def _findings(rows: list[dict], n: int) -> list[str]:
    found = []
    for name, label, fmt, reference in MEASURES:
        measured = [(row["label"], _at(row, n, name)) for row in rows if _at(row, n, name) is not None]
        if not measured:
            continue
        ordered = sorted(measured, key=lambda item: float(item[1]["mean"]))
        (low_label, low), (high_label, high) = ordered[0], ordered[-1]
        sentence = (f"At {n}, {label} runs from `{low_label}` {cell_text(low, fmt)} to `{high_label}` "
                    f"{cell_text(high, fmt)}")
        if reference is not None:
            below = [lab for lab, p in measured if p["high"] is not None and float(p["high"]) < reference(n)]
            sentence += (f"; uniform attention has {reference(n):{fmt}}, and the interval of "
                         + (f"{len(below)} of {len(measured)} rows lies wholly below it" if below else
                            "no row lies wholly below it"))
        found.append(sentence + ".")
    return found
