"""How rows of results are named in tables and plots (shared by report.py and plots.py)."""

from __future__ import annotations


def encoding_label(encoding: str, attention: str = "softmax") -> str:
    """``rope``, ``nope``…; a run with another attention kind than softmax says so."""
    label = "nope" if encoding == "none" else encoding
    return label if attention == "softmax" else f"{label} ({attention} attention)"


def with_scaling(label: str, scaling: str) -> str:
    return label if scaling == "none" else f"{label} + {scaling}"


def row_label(row: dict) -> str:
    """A table row: the run's group label (encoding, made unique per config) + scaling."""
    return with_scaling(row.get("label") or encoding_label(row["encoding"]), row["scaling"])
