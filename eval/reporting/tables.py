"""Report tables: result rows → cells with both intervals, paired comparisons, markdown.

A cell is one row label (encoding, or run-name stem, plus RoPE scaling) at one corpus,
protocol and length; it pools that label's seeds. Each cell and comparison carries two
95% intervals from eval/reporting/stats.py: across training runs (seeds and documents; what a claim
about the method needs) and across documents for the models trained. Marks (▼/▲) use the
first only, after the Benjamini–Hochberg correction over the comparisons of a table. A cell a learned
table cannot serve reads "n/a (trained table: N …)". A heavy-tailed cell (its interval across
training runs spans more than a factor ``HEAVY``: seeds that disagree by orders of magnitude)
shows every seed's value beside the interval, which alone would hide how they disagree.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ropelab.eval.reporting.labels import label_order, replicate_units, row_label, units_of
from ropelab.eval.reporting.stats import (Cell, Contrast, benjamini_hochberg, cell_contrast, contrast, detectable, mark, paired_contrast,
                        seeds_needed)


def _cells_rows(results: dict, corpus: str, protocol: str) -> dict[str, dict[int, list[dict]]]:
    """label -> length -> rows (one per seed), for one corpus and protocol."""
    table: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in results["results"]:
        if row.get("corpus") == corpus and row["protocol"] == protocol:
            table[row_label(row)][row["length"]].append(row)
    return table


def make_cell(rows: list[dict], window_sets: dict, units: Optional[dict[str, str]] = None) -> Optional[Cell]:
    """The pooled cell of some seeds' rows (ordered by seed, so rows trained with the same seeds
    pair seed by seed), or None where any is n/a or they differ in tokens. ``units``: run ->
    its replicate unit (eval/reporting/labels.py: replicate_units), so fine-tunes of one parent count once."""
    rows = sorted(rows, key=lambda r: (r.get("seed", 0), r["run"]))
    if any(r["status"] != "ok" for r in rows) or len({r["window_set"] for r in rows}) != 1:
        return None
    shared = window_sets[rows[0]["window_set"]]
    return Cell(nll=np.array([r["unit_nll"] for r in rows], dtype=np.float64),
                tokens=np.asarray(shared["unit_tokens"], dtype=np.float64),
                bytes=np.asarray(shared["unit_bytes"], dtype=np.float64) if any(shared["unit_bytes"]) else None,
                runs=tuple(r["run"] for r in rows), seeds=tuple(r.get("seed", 0) for r in rows),
                units=units_of(units, (r["run"] for r in rows)))


def _ppl_interval(found: Contrast) -> dict:
    """Perplexity with the across-runs interval where there is one (else the documents'), and
    the documents' interval on its own."""
    runs = found.runs.interval() if found.runs is not None else None
    docs = found.documents.interval()
    low, high = runs or docs
    return {"ppl": math.exp(found.point), "low": math.exp(low), "high": math.exp(high),
            "interval": "runs" if runs else "documents", "doc_low": math.exp(docs[0]), "doc_high": math.exp(docs[1])}


def _bpb_interval(cell: Cell) -> tuple[float, float, float]:
    found = contrast([(1.0, cell)], per_byte=True)
    low, high = (found.runs or found.documents).interval()
    return found.point / math.log(2), low / math.log(2), high / math.log(2)


def summarize(results: dict, corpus: str, protocol: str) -> dict[str, dict[int, dict]]:
    """label -> length -> {ppl, low, high, interval, doc_low, doc_high, bpb, seeds, tokens,
    documents, unit_kind, cell} or {na}."""
    out: dict[str, dict[int, dict]] = {}
    units = replicate_units(results.get("runs", []))
    for label, by_length in _cells_rows(results, corpus, protocol).items():
        cells = {}
        for length, rows in by_length.items():
            cell = make_cell(rows, results["window_sets"], units)
            if cell is None:
                cells[length] = {"na": rows[0].get("note", "n/a"), "train_len": rows[0]["train_len"]}
                continue
            shared = results["window_sets"][rows[0]["window_set"]]
            cells[length] = {**_ppl_interval(cell_contrast(cell)), "seeds": len(rows), "cell": cell,
                             "bpb": _bpb_interval(cell) if cell.bytes is not None else None,
                             "tokens": rows[0]["tokens"], "documents": rows[0]["documents"],
                             "skipped_documents": rows[0].get("skipped_documents", 0), "unit_kind": shared["unit_kind"],
                             "units": len(shared["unit_tokens"]), "train_len": rows[0]["train_len"],
                             "effective_scale": rows[0].get("effective_scale", 1.0)}
        out[label] = cells
    return out


HEAVY = 10.0  # an interval across runs wider than this factor: the cell shows its seeds' values too


def heavy(low: float, high: float) -> bool:
    """Whether an interval of a ratio or perplexity spans more than a factor ``HEAVY``."""
    return low > 0 and high / low > HEAVY


def short_number(value: float) -> str:
    """Three significant figures, thousands separated: 4.3, 11.5, 142, 228,980."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def seeds_text(values, prefix: str = "") -> str:
    """"; seeds ×4.3, ×4.3, ×11.5": every seed's value, in seed order."""
    return "; seeds " + ", ".join(prefix + short_number(v) for v in values)


@dataclass
class Comparison:
    """A contrast of mean log-perplexities read as a perplexity ratio, with its mark (set over
    a whole table by ``mark_table``); ``per_seed``: each seed's own ratio, where it is one row's
    (a degradation) and its seeds line up."""

    found: Contrast
    mark: str = ""
    per_seed: Optional[tuple[float, ...]] = None

    @property
    def ratio(self) -> float:
        return math.exp(self.found.point)

    @property
    def identical(self) -> bool:
        """Both sides are the same numbers (no variance and no difference): not a test."""
        return self.found.point == 0 and self.found.documents.variance == 0

    @property
    def runs(self) -> Optional[tuple[float, float]]:
        """The across-runs 95% interval of the ratio, or None with one seed."""
        if self.found.runs is None:
            return None
        low, high = self.found.runs.interval()
        return math.exp(low), math.exp(high)

    @property
    def documents(self) -> tuple[float, float]:
        low, high = self.found.documents.interval()
        return math.exp(low), math.exp(high)

    @property
    def interval(self) -> tuple[float, float]:
        """The interval a figure draws: across runs where there is one."""
        return self.runs or self.documents


def mark_table(*tables: dict[str, dict[int, Comparison]]) -> int:
    """Mark every comparison of ``tables`` after the Benjamini–Hochberg correction over all of
    them that are tests: an across-runs estimate, and not the same numbers on both sides (a
    scaling at a length where it is plain RoPE). Returns how many were tested."""
    tested = [c for table in tables for cells in table.values() for c in cells.values()
              if c.found.runs is not None and not c.identical]
    for comparison, p in zip(tested, benjamini_hochberg([c.found.runs.p_value for c in tested])):
        comparison.mark = mark(comparison.found.point, p)
    return len(tested)


def compare(results: dict, corpus: str, protocol: str, pairs: list[tuple[str, str]]) -> dict[str, dict[int, Comparison]]:
    """"a vs b" -> length -> the perplexity ratio a / b on the same tokens (marks: mark_table)."""
    rows, units = _cells_rows(results, corpus, protocol), replicate_units(results.get("runs", []))
    out: dict[str, dict[int, Comparison]] = {}
    for a, b in pairs:
        cells = {}
        for length in sorted(set(rows.get(a, {})) & set(rows.get(b, {}))):
            ca, cb = (make_cell(rows[a][length], results["window_sets"], units),
                      make_cell(rows[b][length], results["window_sets"], units))
            if ca is None or cb is None or not np.array_equal(ca.tokens, cb.tokens):
                continue
            cells[length] = Comparison(paired_contrast(ca, cb))
        out[f"{a} vs {b}"] = cells
    return out


def degradation(summary: dict[str, dict[int, dict]], reference: Optional[str] = None) -> dict[str, dict[int, Comparison]]:
    """label -> length -> ppl(length) / ppl(L), L the row's own training length, paired by seed
    (and by unit where both lengths scored the same tokens); with ``reference``, each row's
    ratio over the reference's ("a vs b" keys) instead."""
    out: dict[str, dict[int, Comparison]] = {}
    own = {label: _train_len_cell(cells) for label, cells in summary.items()}
    for label in sorted(summary, key=label_order):
        if own[label] is None or (reference is not None and (label == reference or own.get(reference) is None)):
            continue
        cells = {}
        for n, cell in summary[label].items():
            if "cell" not in cell:
                continue
            terms = [(1.0, cell["cell"]), (-1.0, own[label])]
            if reference is not None:
                ref = summary[reference].get(n, {}).get("cell")
                if ref is None:
                    continue
                terms += [(-1.0, ref), (1.0, own[reference])]
            per_seed = (tuple(np.exp(cell["cell"].seed_values() - own[label].seed_values()))
                        if reference is None and cell["cell"].runs == own[label].runs else None)
            cells[n] = Comparison(contrast(terms), per_seed=per_seed)
        out[label if reference is None else f"{label} vs {reference}"] = cells
    return out


def _train_len_cell(cells: dict[int, dict]) -> Optional[Cell]:
    lengths = {c["train_len"] for c in cells.values() if "train_len" in c}
    at_l = cells.get(next(iter(lengths))) if len(lengths) == 1 else None
    return at_l.get("cell") if at_l else None


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


def ppl_text(cell: Optional[dict], key: str = "ppl") -> str:
    """One perplexity cell of ``summarize``: 'point (low–high)' across training runs (the documents'
    where the row has one seed, marked †; a heavy-tailed cell with its seeds' values too), across
    documents with ``key="documents"``, or bits per byte with ``key="bpb"``."""
    if cell is None:
        return "–"
    if "na" in cell:
        return f"n/a ({cell['na']})"
    if key == "bpb":
        return "–" if cell["bpb"] is None else "{:.3f} ({:.3f}–{:.3f})".format(*cell["bpb"])
    if key == "documents":
        return f"{fmt(cell['ppl'])} ({fmt(cell['doc_low'])}–{fmt(cell['doc_high'])})"
    dagger = "†" if cell["interval"] == "documents" else ""
    seeds_note = seeds_text(np.exp(cell["cell"].seed_values())) if not dagger and heavy(cell["low"], cell["high"]) else ""
    return f"{fmt(cell['ppl'])} ({fmt(cell['low'])}–{fmt(cell['high'])}){dagger}{seeds_note}"


def seed_counts(cells: dict[int, dict]) -> str:
    """A row's seeds column: its seed counts over lengths ("5"; "–" where none was scored)."""
    return ",".join(map(str, sorted({c["seeds"] for c in cells.values() if "seeds" in c}))) or "–"


def interval_table(summary: dict[str, dict[int, dict]], lengths: list[int], key: str = "ppl") -> str:
    """Cells 'point (low–high)' (``ppl_text``): perplexity with its across-runs interval, with
    ``key="documents"`` the documents' interval, or bits per byte with ``key="bpb"``."""
    train_lens = train_lengths(summary)
    rows = [([label, seed_counts(summary[label])], train_lens.get(label),
             [ppl_text(summary[label].get(n), key) for n in lengths]) for label in sorted(summary, key=label_order)]
    return length_table(["row", "seeds"], lengths, rows)


def durations(*seconds: float) -> list[str]:
    """Wall times in one unit: hours ("1.36 h"), or minutes, or seconds, the largest in which
    none of them (but a zero) reads 0, so a short run is never "0.00 h"; a zero (an unrecorded
    or cached time) reads "0" in that unit, whatever the others' sizes."""
    shortest = min((s for s in seconds if s > 0), default=0.0)
    if f"{shortest / 3600:.2f}" != "0.00" or not shortest:
        unit, scale, digits = "h", 3600, 2
    elif f"{shortest / 60:.1f}" != "0.0":
        unit, scale, digits = "min", 60, 1
    else:
        unit, scale, digits = "s", 1, 0
    return [f"0 {unit}" if not s else f"{s / scale:.{digits}f} {unit}" for s in seconds]


def percent(ratio: float) -> str:
    """A ratio as a signed percent difference, with enough digits to tell it from zero."""
    pct = (ratio - 1) * 100
    return f"{pct:+.3f}" if abs(pct) < 0.1 else f"{pct:+.2f}" if abs(pct) < 10 else f"{pct:+.1f}"


def ratio_text(c: Comparison, which: str = "runs") -> str:
    if c.identical:
        return "= (the same numbers)"
    interval = c.documents if which == "documents" else c.runs
    if interval is None:  # one seed: no test across training runs
        return f"{percent(c.ratio)}% (one seed)"
    marked = f" {c.mark}" if which == "runs" and c.mark else ""
    return f"{percent(c.ratio)}% ({percent(interval[0])} to {percent(interval[1])}){marked}"


def _row_lengths(name: str, train_lens: dict[str, int]):
    """The training length of a comparison's rows ("a vs b"), or of one row."""
    a, _, b = name.partition(" vs ")
    la, lb = train_lens.get(a), train_lens.get(b) if b else None
    return la if la == lb or lb is None else f"{la} vs {lb}"


def comparison_table(comparisons: dict[str, dict[int, Comparison]], lengths: list[int],
                     train_lens: dict[str, int], which: str = "runs") -> str:
    """Cells: the perplexity difference in percent (a vs b), its 95% interval across training
    runs with the mark (``which="runs"``), or across documents for the models trained
    (``which="documents"``); ``train_lens``: each row's training length (train_lengths)."""
    rows = []
    for name, cells in comparisons.items():
        if not cells:
            continue
        row = [ratio_text(cells[n], which) if n in cells else "–" for n in lengths]
        rows.append(([name], _row_lengths(name, train_lens), row))
    return length_table(["comparison"], lengths, rows)


def power_text(c: Comparison) -> str:
    """'±d% · n': the smallest difference the seeds detect (80% power, two-sided 5%) and the
    seeds per row the observed difference would need ('–' with one seed)."""
    if c.found.runs is None or c.identical:
        return "–"
    smallest = math.exp(detectable(c.found.runs)) - 1
    need = seeds_needed(c.found.runs, c.found.point)
    seeds = ">100" if need is None else str(need)
    return f"±{smallest * 100:.2g}% · {seeds}"


def has_power(comparisons: dict[str, dict[int, Comparison]]) -> bool:
    """Whether any comparison has a power to state (an across-runs test): else no power table."""
    return any(power_text(c) != "–" for cells in comparisons.values() for c in cells.values())


def power_table(comparisons: dict[str, dict[int, Comparison]], lengths: list[int], train_lens: dict[str, int]) -> str:
    rows = [([name], _row_lengths(name, train_lens), [power_text(cells[n]) if n in cells else "–" for n in lengths])
            for name, cells in comparisons.items() if cells]
    return length_table(["comparison"], lengths, rows)


def degradation_text(c: Optional[Comparison]) -> str:
    """'×r (low–high)' of one row's ppl(kL)/ppl(L), across training runs († across documents, one
    seed), with its seeds' own ratios where it is heavy-tailed."""
    if c is None:
        return "–"
    low, high = c.interval
    dagger = "" if c.runs else "†"
    seeds_note = seeds_text(c.per_seed, "×") if c.runs and c.per_seed and heavy(low, high) else ""
    return f"×{c.ratio:.3f} ({low:.3f}–{high:.3f}){dagger}{seeds_note}"


def degradation_table(ratios: dict[str, dict[int, Comparison]], lengths: list[int], train_lens: dict[str, int],
                      relative: bool = False) -> str:
    """Cells '×r (low–high)' of ppl(kL)/ppl(L) across training runs; ``relative``: differences
    of such ratios against the reference, in percent, with marks."""
    rows = []
    for name, cells in ratios.items():
        text = [("–" if cells.get(n) is None else ratio_text(cells[n])) if relative else degradation_text(cells.get(n))
                for n in lengths]
        rows.append(([name], _row_lengths(name, train_lens), text))
    return length_table(["comparison" if relative else "row"], lengths, rows)


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
    units = {f"{c['units']} {c['unit_kind']}" if "units" in c else c["unit_kind"] for c in seen.values()}
    blocks = ("; blocks are runs of consecutive windows, which are not independent draws, so the intervals across "
              "documents understate the uncertainty there" if any(c["unit_kind"] == "blocks" for c in seen.values())
              else "")
    return "Scored per length: " + "; ".join(parts) + f". Units of the intervals: {', '.join(sorted(units))}{blocks}."
