"""k_max: the longest length at which passkey retrieval succeeds at every depth.

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

from __future__ import annotations

from typing import Iterable, Optional


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
