"""How much context each row uses within L, and the length at which it breaks down past L.

- **Loss by context position.** At each row's training length L (non-overlapping windows),
  the mean NLL in log2 bins of the window position p (the predicted token has p tokens
  before it): [0, 1), [1, 2), [2, 4), …, [L/2, L). Each bin is a cell of per-unit sums
  (eval/lm/perplexity.py), so it gets the same two intervals as a perplexity (eval/reporting/stats.py).
- **Context gain**: mean NLL on positions [8, 16) minus mean NLL on [L/2, L), paired by
  seed and document: how much the second half of the training window is worth over a
  short context. A regime where it is near 0 cannot show how encodings extrapolate,
  whatever they do beyond L.
- **Breakdown length**: the evaluation length at which a row's perplexity first exceeds
  its own at L by 5% (log-linear interpolation between the evaluated lengths), on the
  same-token protocol when it was scored (only the context changes), else on sliding or
  non-overlapping windows (the report names which). Where two or more seeds all break
  down within the evaluated lengths, the value is the geometric mean of the seeds' own
  breakdown lengths with a t-interval around it (on log2 length, S − 1 degrees of freedom;
  fine-tunes of several parents: the parents' means, C − 1, eval/reporting/stats.py),
  cut at L (a breakdown lies past L; seeds that agree exactly, as one model's weights do at a
  fine-tune's step 0, get none: a width-0 interval would claim certainty); otherwise (one
  seed, or a seed that stays within 5%)
  it is where the seeds' mean log-ratio curve crosses, with no interval. A seed that never
  exceeds 5% within the evaluated lengths has none: the row then says how many.
  Press et al. (2022, ICLR, Figure 1 and Table 2: WikiText-103, L = 512 and 1024) show the
  pattern to compare with: sinusoidal breaks down within tens of tokens past L, rotary
  within about 100–200, the T5 bias later, and ALiBi not at all.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ropelab.eval.reporting.intervals import length_interval
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


def crossing(lengths: list[int], log_ratios: list[float], train_len: int,
             threshold: float = math.log(BREAKDOWN)) -> Optional[float]:
    """The first length past ``train_len`` where the log-ratio to L exceeds ``threshold``,
    interpolated linearly in log2(length) from the previous point (L itself at 0), or None."""
    previous = (math.log2(train_len), 0.0)
    for n, r in zip(lengths, log_ratios):
        if n <= train_len:
            continue
        if r > threshold:
            x0, r0 = previous
            return 2 ** (x0 + (threshold - r0) / (r - r0) * (math.log2(n) - x0))
        previous = (math.log2(n), r)
    return None


def breakdown(summary: dict[str, dict[int, dict]], label: str) -> Optional[dict]:
    """The row's breakdown length: {point, low, high, seeds, beyond, longest}, or None where it
    was not scored at L and past it. Where every seed (two or more) breaks down within the
    evaluated lengths, the point is the geometric mean of the seeds' own breakdown lengths and
    the interval a t-interval around it in log length, cut at L (a breakdown lies past L);
    otherwise the point is where the seeds' mean log-ratio curve crosses, with no interval."""
    train_len = train_lengths(summary).get(label)
    cells = summary[label]
    at_l = cells.get(train_len, {}).get("cell")
    lengths = sorted(n for n, c in cells.items() if n > (train_len or 0) and "cell" in c)
    if at_l is None or not lengths:
        return None
    per_seed = np.array([cells[n]["cell"].seed_values() - at_l.seed_values() for n in lengths])  # (lengths, S)
    point = crossing(lengths, list(per_seed @ at_l.weights()), train_len)
    seeds = [crossing(lengths, list(per_seed[:, k]), train_len) for k in range(per_seed.shape[1])]
    out = {"point": point, "low": None, "high": None, "seeds": len(seeds),
           "beyond": sum(b is None for b in seeds), "longest": lengths[-1], "train_len": train_len}
    if at_l.replicates >= 2 and out["beyond"] == 0:
        point, low, high, replicates = length_interval(seeds, at_l.units)
        if low is None:  # one model's weights (a fine-tune's step 0): no interval
            out.update(point=point, agree=replicates)
            return out
        # A breakdown lies past L by definition, so the interval is cut at L: the truth is in
        # that range, so the coverage holds (as the diagnostics cut fractions to [0, 1]).
        out.update(point=point, low=max(low, train_len), high=high)
    return out


def breakdown_text(found: dict) -> str:
    if found["point"] is None:
        return f"> {found['longest']}" + (f" ({found['seeds'] - found['beyond']} of {found['seeds']} seeds cross)"
                                           if found["beyond"] < found["seeds"] else "")
    narrow = found["low"] is not None and round(found["low"]) == round(found["high"])
    digits = 1 if narrow else 0  # an interval narrower than a token stays visible
    text = f"{found['point']:.{digits}f} (×{found['point'] / found['train_len']:.2f} L)"
    if found["low"] is not None:
        return text + f" ({found['low']:.{digits}f}–{found['high']:.{digits}f})"
    if found.get("agree"):
        return text + (f"; its {found['agree']} seeds agree exactly (the same weights, as at a fine-tune's step 0): "
                       "no spread to make an interval from")
    if found["beyond"]:
        return text + f"; {found['beyond']} of {found['seeds']} seeds stay within 5% to {found['longest']}"
    return text + " (one seed)"


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
            f"The evaluation length at which each row's perplexity first exceeds its own at L by 5% ({protocol} "
            "protocol; interpolated in log length between evaluated lengths). Where every seed breaks down within the "
            "evaluated lengths (two or more seeds), the value is the geometric mean of the seeds' own breakdown "
            "lengths with a 95% t-interval over them (in log length, cut at L: a breakdown lies past L; none where the "
            "seeds agree exactly, as one model's weights do); otherwise "
            "it is where the seeds' mean curve crosses, and no interval is given. For comparison, Press et al. "
            "(2022, Figure 1 and Table 2; WikiText-103, L = 512) find sinusoidal breaking down within tens of "
            "tokens past L, rotary within about 100–200, the T5 bias later and ALiBi not at all.", "",
            "| row | L | breakdown length (95% interval) |", "|---|---:|---:|",
            *[f"| {label} | {found['train_len']} | {breakdown_text(found)} |" for label, found in rows]]

