"""Markdown tables of the attention diagnostics' pooled rows (eval/diagnostics/report.py pools
them; eval/diagnostics/needle.py writes the needle's tables with these too)."""

from __future__ import annotations

from typing import Optional

import numpy as np


def uniform_entropy(length: int) -> float:
    """Mean over queries of ln(i + 1): the entropy of uniform causal attention."""
    return float(np.mean(np.log(np.arange(1, length + 1))))


def uniform_distance(length: int) -> float:
    """Mean over queries of i/2: the attended distance of uniform causal attention."""
    return (length - 1) / 4


def cell_text(p: Optional[dict], fmt: str, index=()) -> str:
    """A pooled measure (eval/diagnostics/report.py: ``pool``) at ``index``: its mean, and its
    interval where it has one; "–" where it was not measured."""
    if p is None:
        return "–"
    mean = float(np.asarray(p["mean"])[index])
    if p["low"] is None:
        return format(mean, fmt)
    return f"{mean:{fmt}} [{float(np.asarray(p['low'])[index]):{fmt}}, {float(np.asarray(p['high'])[index]):{fmt}}]"


def length_heads(train_len: int, lengths: list[int]) -> list[str]:
    """Column heads: each length with its multiple of L."""
    return [f"{n} (L)" if n == train_len else f"{n} ({n / train_len:g}L)" for n in lengths]


def header(left: list[str], right: list[str], train_len: int, lengths: list[int]) -> list[str]:
    """A table's head line and rule: the ``left``-aligned columns, the ``right``-aligned ones,
    then one right-aligned column per length (``length_heads``)."""
    return ["| " + " | ".join([*left, *right, *length_heads(train_len, lengths)]) + " |",
            "|" + "---|" * len(left) + "---:|" * (len(right) + len(lengths))]


def table(rows: list[dict], lengths: list[int], name: str, fmt: str, reference=None) -> list[str]:
    """One line per row that measured ``name``, one column per length; ``reference(n)``, when
    given, is a first line (e.g. what uniform attention would give)."""
    lines = header(["row"], [], rows[0]["train_len"], lengths)
    if reference is not None:
        lines.append("| *uniform attention* | " + " | ".join(format(reference(n), fmt) for n in lengths) + " |")
    for row in rows:
        if any(name in row["lengths"].get(n, {}) for n in lengths):
            lines.append(f"| {row['label']} | " + " | ".join(cell_text(row["lengths"].get(n, {}).get(name), fmt)
                                                             for n in lengths) + " |")
    return lines
