"""Report tables: result rows → cells with 95% intervals, paired comparisons, markdown.

A cell is one row label (encoding, or run-name stem, plus RoPE scaling) at one corpus,
protocol and length; it pools that label's seeds. Intervals and comparisons come from
eval/stats.py. A cell a learned table cannot serve reads "n/a (trained table: N …)".
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Optional

import numpy as np

from eval.labels import label_order, row_label
from eval.stats import Cell, cell_interval, paired_ratio, significance


def _cells_rows(results: dict, corpus: str, protocol: str) -> dict[str, dict[int, list[dict]]]:
    """label -> length -> rows (one per seed), for one corpus and protocol."""
    table: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in results["results"]:
        if row.get("corpus") == corpus and row["protocol"] == protocol:
            table[row_label(row)][row["length"]].append(row)
    return table


def make_cell(rows: list[dict], window_sets: dict) -> Optional[Cell]:
    """The pooled cell of some seeds' rows, or None where any is n/a or they differ in tokens."""
    rows = sorted(rows, key=lambda r: r["run"])
    if any(r["status"] != "ok" for r in rows) or len({r["window_set"] for r in rows}) != 1:
        return None
    shared = window_sets[rows[0]["window_set"]]
    return Cell(nll=np.array([r["unit_nll"] for r in rows], dtype=np.float64),
                tokens=np.asarray(shared["unit_tokens"], dtype=np.float64),
                bytes=np.asarray(shared["unit_bytes"], dtype=np.float64) if any(shared["unit_bytes"]) else None,
                runs=tuple(r["run"] for r in rows))


def summarize(results: dict, corpus: str, protocol: str) -> dict[str, dict[int, dict]]:
    """label -> length -> {ppl, low, high, bpb, seeds, tokens, documents, unit_kind} or {na}."""
    out: dict[str, dict[int, dict]] = {}
    for label, by_length in _cells_rows(results, corpus, protocol).items():
        cells = {}
        for length, rows in by_length.items():
            cell = make_cell(rows, results["window_sets"])
            if cell is None:
                cells[length] = {"na": rows[0].get("note", "n/a"), "train_len": rows[0]["train_len"]}
                continue
            ppl, low, high = cell_interval(cell)
            bpb = cell_interval(cell, per_byte=True) if cell.bytes is not None else None
            shared = results["window_sets"][rows[0]["window_set"]]
            cells[length] = {"ppl": ppl, "low": low, "high": high, "bpb": bpb, "seeds": len(rows),
                             "tokens": rows[0]["tokens"], "documents": rows[0]["documents"],
                             "skipped_documents": rows[0].get("skipped_documents", 0), "unit_kind": shared["unit_kind"],
                             "train_len": rows[0]["train_len"],
                             "effective_scale": rows[0].get("effective_scale", 1.0)}
        out[label] = cells
    return out


def compare(results: dict, corpus: str, protocol: str, pairs: list[tuple[str, str]]) -> dict[str, dict[int, tuple]]:
    """"a vs b" -> length -> (ratio, low, high, mark) of perplexity a / b on the same tokens."""
    rows = _cells_rows(results, corpus, protocol)
    out: dict[str, dict[int, tuple]] = {}
    for a, b in pairs:
        cells = {}
        for length in sorted(set(rows.get(a, {})) & set(rows.get(b, {}))):
            ca, cb = make_cell(rows[a][length], results["window_sets"]), make_cell(rows[b][length], results["window_sets"])
            if ca is None or cb is None or not np.array_equal(ca.tokens, cb.tokens):
                continue
            ratio, low, high = paired_ratio(ca, cb)
            cells[length] = (ratio, low, high, significance(low, high))
        out[f"{a} vs {b}"] = cells
    return out


def identical_rows(results: dict, corpus: str, protocol: str, labels: list[str]) -> dict[str, str]:
    """label -> the earlier label (in ``labels``' order) it equals bit for bit: the same
    lengths, and at each the same tokens and exactly the same per-unit NLL of every seed.

    Dynamic NTK scored on windows of exactly L_eval tokens is NTK at s = L_eval / L_train,
    so those two rows are one result twice; comparing either with a third row says the
    same thing twice, and comparing them with each other says nothing.
    """
    rows = _cells_rows(results, corpus, protocol)

    def same(a: str, b: str) -> bool:
        if set(rows.get(a, {})) != set(rows.get(b, {})) or not rows.get(a):
            return False
        for length in rows[a]:
            ca, cb = make_cell(rows[a][length], results["window_sets"]), make_cell(rows[b][length], results["window_sets"])
            if ca is None or cb is None or not (np.array_equal(ca.tokens, cb.tokens) and np.array_equal(ca.nll, cb.nll)):
                return False
        return True

    out: dict[str, str] = {}
    for i, label in enumerate(labels):
        match = next((earlier for earlier in labels[:i] if earlier not in out and same(label, earlier)), None)
        if match is not None:
            out[label] = match
    return out


# --- markdown -------------------------------------------------------------------------------

def fmt(value: float) -> str:
    if not math.isfinite(value):
        return "inf"
    return f"{value:.1f}" if value >= 100 else f"{value:.2f}" if value >= 10 else f"{value:.3f}"


def _mark_l(n: int, train_len) -> str:
    return f"{n} (L)" if n == train_len else str(n)


def length_table(heads: list[str], lengths: list[int], rows: list[tuple[list[str], object, list[str]]],
                 mark: Callable[[int, object], str] = _mark_l) -> str:
    """A markdown table with a column per length; ``rows`` are (names, the row's training length
    L, cells). Every row trained at one L: L is marked in the header (``mark(n, L)``, "128 (L)").
    Rows trained at several (a fine-tune beside its parent): an L column says each row's own."""
    own = len({train_len for _, train_len, _ in rows}) > 1
    train_len = None if own or not rows else rows[0][1]
    head = [*heads, *(["L"] if own else []), *(mark(n, train_len) for n in lengths)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(heads) + "---:|" * (len(head) - len(heads))]
    for names, row_len, cells in rows:
        lines.append("| " + " | ".join([*names, *([str(row_len)] if own else []), *cells]) + " |")
    return "\n".join(lines)


def train_lengths(summary: dict[str, dict[int, dict]]) -> dict[str, int]:
    """label -> the training length L of its runs (a row pools one experiment's seeds: one L)."""
    return {label: cell["train_len"] for label, cells in summary.items() for cell in cells.values()
            if "train_len" in cell}


def interval_table(summary: dict[str, dict[int, dict]], lengths: list[int], key: str = "ppl") -> str:
    """Cells 'point (low–high)'; bits per byte with ``key="bpb"``."""
    rows, train_lens = [], train_lengths(summary)
    for label in sorted(summary, key=label_order):
        cells = []
        for n in lengths:
            cell = summary[label].get(n)
            if cell is None:
                cells.append("–")
            elif "na" in cell:
                cells.append(f"n/a ({cell['na']})")
            elif key == "bpb":
                cells.append("–" if cell["bpb"] is None else "{:.3f} ({:.3f}–{:.3f})".format(*cell["bpb"]))
            else:
                cells.append(f"{fmt(cell['ppl'])} ({fmt(cell['low'])}–{fmt(cell['high'])})")
        rows.append(([label], train_lens.get(label), cells))
    return length_table(["row"], lengths, rows)


def ratio_to_train_len(summary: dict[str, dict[int, dict]], lengths: list[int]) -> str:
    """Each row's perplexity over its own at its own training length L (point estimates:
    different tokens, not paired)."""
    rows, train_lens = [], train_lengths(summary)
    for label in sorted(summary, key=label_order):
        base = summary[label].get(train_lens.get(label), {}).get("ppl")
        cells = [f"×{summary[label][n]['ppl'] / base:.2f}" if base and "ppl" in summary[label].get(n, {}) else "–"
                 for n in lengths]
        rows.append(([label], train_lens.get(label), cells))
    return length_table(["row"], lengths, rows)


def durations(*seconds: float) -> list[str]:
    """Wall times in one unit: hours ("1.36 h"), or minutes, or seconds, the largest in which
    none of them (but a zero) reads 0, so a short run is never "0.00 h"."""
    shortest = min((s for s in seconds if s > 0), default=0.0)
    if f"{shortest / 3600:.2f}" != "0.00" or not shortest:
        return [f"{s / 3600:.2f} h" for s in seconds]
    if f"{shortest / 60:.1f}" != "0.0":
        return [f"{s / 60:.1f} min" for s in seconds]
    return [f"{s:.0f} s" for s in seconds]


def percent(ratio: float) -> str:
    """A ratio as a signed percent difference, with enough digits to tell it from zero."""
    pct = (ratio - 1) * 100
    return f"{pct:+.3f}" if abs(pct) < 0.1 else f"{pct:+.2f}" if abs(pct) < 10 else f"{pct:+.1f}"


def comparison_table(comparisons: dict[str, dict[int, tuple]], lengths: list[int],
                     train_lens: dict[str, int]) -> str:
    """Cells: perplexity difference in percent (a vs b), its 95% interval and the mark;
    ``train_lens``: each row's training length (train_lengths)."""
    rows = []
    for name, cells in comparisons.items():
        if not cells:
            continue
        a, b = (train_lens.get(label) for label in name.split(" vs ", 1))
        row = [f"{percent(cells[n][0])}% ({percent(cells[n][1])} to {percent(cells[n][2])}) {cells[n][3]}"
               if n in cells else "–" for n in lengths]
        rows.append(([name], a if a == b else f"{a} vs {b}", row))
    return length_table(["comparison"], lengths, rows)


def scored_line(summary: dict[str, dict[int, dict]], lengths: list[int]) -> str:
    """Tokens and documents scored per length (the same for every row on one corpus)."""
    seen = {}
    for cells in summary.values():
        for n, cell in cells.items():
            if "tokens" in cell:
                seen.setdefault(n, cell)
    parts = []
    for n in lengths:
        if n in seen:
            c = seen[n]
            skipped = f", {c['skipped_documents']} shorter documents skipped" if c["skipped_documents"] else ""
            parts.append(f"{n}: {c['tokens']:,} tokens in {c['documents']:,} documents{skipped}")
    units = {c["unit_kind"] for c in seen.values()}
    return ("Scored per length: " + "; ".join(parts) + f". Bootstrap units: {', '.join(sorted(units))}.")
