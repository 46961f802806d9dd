"""Which rows a perplexity report's section compares, shared by its tables and its summary.

Every row is compared with the reference row (eval.reference), and the RoPE scalings with each
other; a row identical to an earlier one bit for bit (dynamic NTK on windows of exactly
L_eval tokens is NTK) is folded into it and has none of its own. In a budget grid (reference
"ROW @ STEP") each fine-tune is compared with the reference after as many steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Optional

from ropelab.eval.reporting.ablations import is_ablation
from ropelab.eval.reporting.labels import budget_partner, label_order, split_step, with_scaling
from ropelab.eval.reporting.tables import compare, degradation, identical_rows, mark_table
from ropelab.model.config import SCALING_TYPES


def section_comparisons(results: dict, corpus: str, protocol: str, summary: dict, reference: str,
                        folded: Optional[dict[str, str]] = None) -> dict:
    """The pairs a section compares; ``folded`` rows (identical to a kept one, ``folded_rows``) have none."""
    labels = sorted(summary, key=label_order)
    if split_step(reference)[1] is not None:  # a budget grid: each fine-tune against the reference after as many steps
        pairs = [(label, partner) for label in labels
                 if (partner := budget_partner(label, reference)) != label and partner in summary]
        return compare(results, corpus, protocol, pairs)
    labels = [label for label in labels if label not in (folded or {})]
    pairs = [(label, reference) for label in labels if label != reference and reference in summary]
    scaled = {with_scaling(reference, scaling) for scaling in SCALING_TYPES}  # "rope + linear (PI)", …
    scalings = [label for label in labels if label in scaled]
    pairs += [(a, b) for a, b in combinations(scalings, 2) if (a, b) not in pairs and (b, a) not in pairs]
    return compare(results, corpus, protocol, pairs)


def folded_rows(results: dict, corpus: str, protocol: str, summary: dict, reference: str) -> dict[str, str]:
    """Rows identical to another at every length (dynamic NTK = NTK here) -> the row kept for
    comparisons. Report order, but dynamic NTK last, so NTK is the one kept. None in a budget
    grid, whose rows are paired by step instead."""
    if split_step(reference)[1] is not None:
        return {}
    order = sorted(summary, key=lambda label: (label.endswith("+ dynamic"), label_order(label)))
    return identical_rows(results, corpus, protocol, order)


@dataclass
class Marked:
    """A section's comparisons with their marks: the study's rows and the sweep's ablation rows,
    each a correction family of its own (``tested``: how many of each are tests), and the rows
    folded into another."""

    study: dict
    ablations: dict
    folded: dict[str, str]
    tested: int
    ablations_tested: int


def marked_comparisons(results: dict, corpus: str, protocol: str, summary: dict, reference: str) -> Marked:
    """The section's comparisons with the reference, split into the study's and the ablations'
    (eval/reporting/ablations.py), each marked after its own Benjamini–Hochberg correction."""
    folded = folded_rows(results, corpus, protocol, summary, reference)
    comparisons = section_comparisons(results, corpus, protocol, summary, reference, folded)
    ablations = results.get("ablations") or {}
    extra = {name: cells for name, cells in comparisons.items() if is_ablation(name, ablations)}
    study = {name: cells for name, cells in comparisons.items() if name not in extra}
    return Marked(study, extra, folded, mark_table(study), mark_table(extra))


def relative_degradation(summary: dict, reference: str, folded: dict[str, str],
                         ablations: dict[str, str]) -> tuple[dict, int]:
    """Each study row's degradation over the reference's (ppl(kL)/ppl(L) against the reference's),
    marked as one family, and how many are tests; none in a budget grid, which pairs by step."""
    if reference not in summary or split_step(reference)[1] is not None:
        return {}, 0
    relative = {name: cells for name, cells in degradation(summary, reference).items()
                if name.split(" vs ")[0] not in folded and not is_ablation(name, ablations)}
    return relative, mark_table(relative)
