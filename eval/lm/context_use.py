"""How much context each row uses within L, and the length at which it breaks down past L.

- **Loss by context position.** At each row's training length L (non-overlapping windows),
  the mean NLL in log2 bins of the window position p (the predicted token has p tokens
  before it): [0, 1), [1, 2), [2, 4), …, [L/2, L). Each bin is a cell of per-unit sums
  (eval/lm/perplexity.py), so it gets the same two intervals as a perplexity (eval/reporting/stats.py).
- **Context gain**: mean NLL on positions [8, 16) minus mean NLL on [L/2, L), paired by
  seed and document: how much the second half of the training window is worth over a
  short context. A regime where it is near 0 cannot show how encodings extrapolate,
  whatever they do beyond L.
- **Breakdown length**: the first evaluation length at which a seed's perplexity exceeds its
  own at L by 5%, on the same-token protocol when it was scored (only the context changes),
  else on sliding or non-overlapping windows (the report names which). It is known only on the
  grid of evaluated lengths: a seed first above 5% at n broke down after the evaluated length
  before n (or L) and by n, so a row is reported as the grid values its seeds' breakdowns fall
  between, with every seed's own first length beside them ("192–256 (×1.5–×2 L); seeds 256,
  256, 192"), never as a value interpolated between grid lengths or a mean of them (a length
  no seed was measured at). A seed that stays within 5% to the longest evaluated length reads
  "> longest"; fine-tunes of several parents list every run, in run order.
  Press et al. (2022, ICLR, Figure 1 and Table 2: WikiText-103, L = 512 and 1024) show the
  pattern to compare with: sinusoidal breaks down within tens of tokens past L, rotary
  within about 100–200, the T5 bias later, and ALiBi not at all.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ropelab.eval.reporting.labels import label_order, replicate_units, units_of
from ropelab.eval.reporting.stats import Cell, Contrast, cell_contrast, contrast
from ropelab.eval.reporting.tables import _cells_rows, train_lengths

GAIN_SHORT = (8, 16)  # the short-context bin of the context gain
BREAKDOWN = 1.05  # a breakdown: perplexity 5% above its own at L


def position_cells(rows: list[dict], window_sets: dict,
                   units: Optional[dict[str, str]] = None) -> Optional[list[tuple[int, int, Cell]]]:
    """(first, end, cell) per log2 position bin of one row's seeds at one length, or None where
    the rows carry no position sums (sliding windows, older results). ``units``: as make_cell's."""
    rows = sorted(rows, key=lambda r: (r.get("seed", 0), r["run"]))
    if any(r["status"] != "ok" or not r.get("position_unit_nll") for r in rows):
        return None
    if len({r["window_set"] for r in rows}) != 1:
        return None
    shared = window_sets[rows[0]["window_set"]]
    edges, tokens = shared.get("position_edges"), shared.get("position_unit_tokens")
    if not edges:
        return None
    out = []
    for b, (first, end) in enumerate(zip(edges[:-1], edges[1:])):
        nll = np.array([r["position_unit_nll"][b] for r in rows], dtype=np.float64)
        out.append((first, end, Cell(nll=nll, tokens=np.asarray(tokens[b], dtype=np.float64),
                                     runs=tuple(r["run"] for r in rows), seeds=tuple(r.get("seed", 0) for r in rows),
                                     units=units_of(units, (r["run"] for r in rows)))))
    return out


def position_bins(results: dict, corpus: str) -> dict[str, list[tuple[int, int, Cell]]]:
    """label -> its position bins at its own training length L (non-overlapping windows)."""
    out, units = {}, replicate_units(results.get("runs", []))
    for label, by_length in _cells_rows(results, corpus, "nonoverlap").items():
        train_len = next(iter(by_length.values()))[0]["train_len"]
        bins = position_cells(by_length[train_len], results["window_sets"], units) if train_len in by_length else None
        if bins:
            out[label] = bins
    return out


def context_gain(bins: list[tuple[int, int, Cell]]) -> Optional[Contrast]:
    """NLL on [8, 16) minus NLL on the last bin [L/2, L), or None when L ≤ 16."""
    short = next((cell for first, end, cell in bins if (first, end) == GAIN_SHORT), None)
    first, end, far = bins[-1]
    if short is None or first < GAIN_SHORT[1]:
        return None
    return contrast([(1.0, short), (-1.0, far)])


def _interval_text(found: Contrast, digits: int = 3) -> str:
    est = found.runs or found.documents
    low, high = est.interval()
    mark = "" if found.runs else "†"
    return f"{found.point:.{digits}f} ({low:.{digits}f} to {high:.{digits}f}){mark}"


def context_section(results: dict, corpus: str) -> list[str]:
    """The report's tables: loss by context position at L, and each row's context gain."""
    bins = position_bins(results, corpus)
    if not bins:
        return []
    edges = sorted({(first, end) for row in bins.values() for first, end, _ in row})
    head = "| row | L | " + " | ".join(f"[{a}, {b})" for a, b in edges) + " |"
    lines = ["", "### Context use", "",
             "Mean NLL (nats) by the predicted token's position p in the window at the row's own L (non-overlapping "
             "windows; p tokens precede it), 95% interval across training runs († across documents, one seed):", "",
             head, "|---|---:|" + "---:|" * len(edges)]
    gains = []
    for label in sorted(bins, key=label_order):
        by_edge = {(first, end): cell for first, end, cell in bins[label]}
        cells = [_interval_text(cell_contrast(by_edge[e]), 2) if e in by_edge else "–" for e in edges]
        train_len = bins[label][-1][1]
        lines.append(f"| {label} | {train_len} | " + " | ".join(cells) + " |")
        gain = context_gain(bins[label])
        gains.append(f"| {label} | " + (_interval_text(gain) + " | " + _docs_text(gain) if gain else "– | –") + " |")
    return lines + ["", f"Context gain: mean NLL on positions [{GAIN_SHORT[0]}, {GAIN_SHORT[1]}) minus mean NLL on "
                    "[L/2, L), in nats, paired by seed and document: what the second half of a training window is "
                    "worth over a short context. Near 0, a regime cannot show how encodings extrapolate.", "",
                    "| row | context gain, across training runs | across documents |", "|---|---:|---:|", *gains]


def _docs_text(found: Contrast) -> str:
    low, high = found.documents.interval()
    return f"{found.point:.3f} ({low:.3f} to {high:.3f})"


# --- breakdown length --------------------------------------------------------------------------


def first_above(lengths: list[int], log_ratios: list[float], train_len: int,
                threshold: float = math.log(BREAKDOWN)) -> Optional[tuple[int, int]]:
    """(previous, first): the first evaluated length past ``train_len`` whose log-ratio to L
    exceeds ``threshold`` and the evaluated length before it (L itself for the first), between
    which the breakdown lies; None where no length exceeds it."""
    previous = train_len
    for n, r in zip(lengths, log_ratios):
        if n <= train_len:
            continue
        if r > threshold:
            return previous, n
        previous = n
    return None


def breakdown(summary: dict[str, dict[int, dict]], label: str) -> Optional[dict]:
    """The row's breakdown on the grid of evaluated lengths: {per_seed, low, high, seeds, beyond,
    longest, train_len}, or None where it was not scored at L and past it. ``per_seed`` is each
    seed's first length above 5% (None: within 5% to ``longest``), in the cell's seed order;
    ``low``–``high`` the grid values the crossing seeds' breakdowns lie between (None where no
    seed crosses)."""
    train_len = train_lengths(summary).get(label)
    cells = summary[label]
    at_l = cells.get(train_len, {}).get("cell")
    lengths = sorted(n for n, c in cells.items() if n > (train_len or 0) and "cell" in c)
    if at_l is None or not lengths:
        return None
    per_seed = np.array([cells[n]["cell"].seed_values() - at_l.seed_values() for n in lengths])  # (lengths, S)
    found = [first_above(lengths, list(per_seed[:, k]), train_len) for k in range(per_seed.shape[1])]
    crossed = [f for f in found if f is not None]
    return {"per_seed": [None if f is None else f[1] for f in found], "seeds": len(found),
            "beyond": len(found) - len(crossed), "longest": lengths[-1], "train_len": train_len,
            "low": min(f[0] for f in crossed) if crossed else None,
            "high": max(f[1] for f in crossed) if crossed else None}


def breakdown_text(found: dict) -> str:
    """The grid values a row's seeds break down between (in multiples of L), then every seed's
    own first length above 5% ("> longest" for one that stays within)."""
    longest, train_len = found["longest"], found["train_len"]
    if found["low"] is None:
        return f"> {longest}" + ("" if found["seeds"] == 1 else f" (all {found['seeds']} seeds)")
    low, high = found["low"], found["high"]
    span = (f"{low}–{high} (×{low / train_len:g}–×{high / train_len:g} L)" if not found["beyond"] else
            f"past {low} (×{low / train_len:g} L)")
    if found["seeds"] == 1:
        return f"{span}; one seed"
    return f"{span}; seeds " + ", ".join(f"> {longest}" if v is None else str(v) for v in found["per_seed"])


def breakdown_section(summaries: dict[str, dict[str, dict[int, dict]]]) -> list[str]:
    """The breakdown table from the first protocol scored of same-tokens, sliding, nonoverlap."""
    protocol = next((p for p in ("same-tokens", "sliding", "nonoverlap") if summaries.get(p)), None)
    if protocol is None:
        return []
    summary = summaries[protocol]
    rows = [(label, breakdown(summary, label)) for label in sorted(summary, key=label_order)]
    rows = [(label, found) for label, found in rows if found is not None]
    if not rows:
        return []
    return ["", "### Breakdown length", "",
            f"The first evaluation length at which each seed's perplexity exceeds its own at L by 5% ({protocol} "
            "protocol). Known only on the grid of evaluated lengths (a seed first above 5% at n broke down after the "
            "evaluated length before n), a row gives the grid values its seeds' breakdowns fall between, in tokens and "
            "multiples of L, then each seed's own first length above 5%, in seed order (> the longest length: a seed "
            "that stays within 5%; past n: some seeds do). For comparison, Press et al. "
            "(2022, Figure 1 and Table 2; WikiText-103, L = 512) find sinusoidal breaking down within tens of "
            "tokens past L, rotary within about 100–200, the T5 bias later and ALiBi not at all.", "",
            "| row | L | breakdown: grid values; each seed |", "|---|---:|---:|",
            *[f"| {label} | {found['train_len']} | {breakdown_text(found)} |" for label, found in rows]]

