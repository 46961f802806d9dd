"""The attention diagnostics' report: seeds pooled into rows, tables with 95% intervals, figures.

A row is one experiment (runs that are the same apart from the seed, eval/reporting/labels.py, as in
the perplexity report). Every measure is first reduced per window (e.g. the mean entropy over
a window's layers, heads and queries), then pooled: with two or more seeds, the mean of the
per-seed means with a t-interval across the seeds (what another set of training runs would
give); with one run, the mean over its windows with a t-interval across the windows (how
sure we are of this one model's number). The report says which for every row.

Heads are not aligned across seeds: head 3 of one training run has no counterpart in another.
So a measure per head is pooled only after each run's heads are put in an order of its own:
the needle's head is each run's own retrieval head (the one with the most attention on the
key at its shortest measured length), and a row of several runs draws its sink heatmap with
each layer's heads ranked by their sink mass, run by run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np

from ropelab.common.atomic import write_text_atomic
from ropelab.eval.diagnostics.plots import (plot_attention_maps, plot_distance_histogram, plot_entropy_distance,
                                   plot_pair_shares, plot_position_entropy, plot_sink_heatmaps)
from ropelab.eval.diagnostics.summary import summary_section
from ropelab.eval.diagnostics.tables import cell_text, header, table, uniform_distance, uniform_entropy
from ropelab.eval.reporting.labels import label_groups
from ropelab.eval.diagnostics.needle import needle_section
from ropelab.eval.lm.report import regenerate_line, write_report_files
from ropelab.eval.reporting.runs_section import incomplete_note, missing_lines, provenance
from ropelab.eval.reporting.intervals import t_interval

LINEAR = ("linear attention forms no attention matrix (its weights φ(q)ᵀφ(k), rotated in the numerator only, "
          "are not a distribution), so entropy, distance, sinks and needle mass do not apply; the q·k norm "
          "per RoPE frequency pair does, on the features its numerator rotates")


# What ``window_measures`` gives, and a report's results.json keeps (``_reduced``).
MEASURES = ("entropy", "distance", "sink", "needle", "needle_first", "entropy_by_position", "distance_histogram",
            "sink_heads", "sink_rate", "needle_heads", "needle_first_heads", "qk_share")


def window_measures(cell: dict, meta: dict) -> dict[str, np.ndarray]:
    """Each measure of one run at one length, reduced per window: (W,) or (W, …). A cell read
    back from a report's results.json holds them already: marked ``per_window``, or, in the
    files written before that mark existed, told by the measures only a reduced cell has."""
    if cell.get("per_window") or "sink_rate" in cell or "qk_share" in cell:
        return {name: np.asarray(cell[name], dtype=np.float64) for name in cell
                if name in MEASURES or _by_type(name)}
    out = {}
    for name in ("entropy", "distance", "sink", "needle", "needle_first"):
        if name in cell:
            out[name] = np.asarray(cell[name]).mean(axis=(1, 2))
    for name in ("entropy_by_position", "distance_histogram"):
        if name in cell:
            out[name] = np.asarray(cell[name]).mean(axis=(1, 2))
    if "sink" in cell:
        heads = np.asarray(cell["sink"])  # (W, layers, H)
        out["sink_heads"] = heads
        out["sink_rate"] = (heads > meta["epsilon"]).mean(axis=(1, 2))
    if "needle" in cell:
        out["needle_heads"] = np.asarray(cell["needle"])
    if "needle_first" in cell:
        out["needle_first_heads"] = np.asarray(cell["needle_first"])
    if "qk_pairs" in cell:
        pairs = np.asarray(cell["qk_pairs"])  # (W, layers, H, P): a plan's rotary layers only
        out["qk_share"] = (pairs / pairs.sum(-1, keepdims=True)).mean(axis=2)  # (W, layers, P)
    for name in meta.get("layer_types") and TYPED or ():  # a layer plan: each type's own layers too
        if name in cell:
            values = np.asarray(cell[name])  # (W, layers, H, …)
            for kind in sorted(set(meta["layer_types"])):
                layers = [i for i, t in enumerate(meta["layer_types"]) if t == kind]
                out[f"{name}@{kind}"] = values[:, layers].mean(axis=(1, 2))
    return out


# Measures a layer plan's report gives per layer type as well (``NAME@TYPE``): a NoPE layer's
# entropy or a window's distance says nothing of the plan's other layers.
TYPED = ("entropy", "distance", "sink")


def _by_type(name: str) -> bool:
    return "@" in name and name.split("@")[0] in TYPED


# Measures that are fractions of a query's attention (or of the heads), so within [0, 1]; all
# measures are ≥ 0. An interval is cut to that range: the truth lies in it, so coverage holds.
FRACTIONS = frozenset({"sink", "sink_rate", "sink_heads", "needle", "needle_heads", "needle_top", "needle_first",
                       "needle_first_heads", "needle_first_top", "qk_share", "distance_histogram"})


def pool(per_run: list[np.ndarray], ceiling: float = np.inf) -> Optional[dict]:
    """Mean and 95% interval, elementwise, of per-window values of a row's runs (see the module
    doc), the interval cut to [0, ``ceiling``]."""
    per_run = [np.asarray(v, dtype=np.float64) for v in per_run if len(v)]
    if not per_run:
        return None
    across_runs = len(per_run) >= 2
    mean, low, high = t_interval([v.mean(axis=0) for v in per_run] if across_runs else per_run[0])
    if low is not None:
        low, high = np.clip(low, 0, ceiling), np.clip(high, 0, ceiling)
    return {"mean": mean, "low": low, "high": high, "across": "runs" if across_runs else "windows",
            "n": len(per_run) if across_runs else len(per_run[0])}


def pooled_rows(results: dict) -> list[dict]:
    """One entry per row: its runs, and per length every measure pooled (see ``pool``)."""
    runs = results["runs"]
    label_groups(runs, [])
    rows = []
    for label in sorted({r["label"] for r in runs}):
        members = [r for r in runs if r["label"] == label]
        lengths = sorted({int(n) for r in members for n in results["cells"][r["run"]]})
        row = {"label": label, "encoding": members[0]["encoding"], "attention": members[0].get("attention", "softmax"),
               "runs": members, "train_len": members[0]["train_len"], "lengths": {}, "notes": {}, "uniform": {}}
        measured = {}  # length -> [(cell, run, its measures per window)] of the runs measured there
        for n in lengths:
            cells = [(results["cells"][r["run"]].get(str(n)), r) for r in members]
            ok = [(c, r) for c, r in cells if c and c["status"] == "ok"]
            row["notes"][n] = sorted({c["note"] for c, _ in cells if c and c["status"] != "ok"}
                                     | {c["needle_note"] for c, _ in ok if "needle_note" in c})
            if ok:
                measured[n] = [(c, r, window_measures(c, r)) for c, r in ok]
        row["sinks_ranked"] = several = len(members) >= 2  # heads of several runs are not aligned
        _order_heads(measured, ranked_sinks=several)
        row["needle_top_runs"] = _retrieval_head_per_run(measured)
        for n, entries in measured.items():
            measures = [m for _, _, m in entries]
            names = {name for m in measures for name in m}
            # Caches from before the first-query measure lack it: a row pools it from all its runs or not at all.
            names -= {name for name in ("needle_first", "needle_first_top") if any(name not in m for m in measures)}
            row["lengths"][n] = {name: pool([m[name] for m in measures if name in m], 1.0 if name in FRACTIONS else np.inf)
                                 for name in sorted(names - UNALIGNED if several else names)}
            needle_uniform = [u for c, _, _ in entries for u in c.get("needle_uniform", [])]
            row["uniform"][n] = float(np.mean(needle_uniform)) if needle_uniform else None
            by_depth = _needle_by_depth(entries)
            if by_depth:
                row.setdefault("needle_depth", {})[n] = by_depth
        rows.append(row)
    return rows


# Per-head measures left in head-index order, which pool over one run only (module doc).
UNALIGNED = frozenset({"needle_heads", "needle_first_heads"})


def _order_heads(measured: dict[int, list[tuple]], ranked_sinks: bool) -> None:
    """Put each run's heads in an order of its own before seeds are pooled (module doc): add
    ``needle_top``, the run's retrieval head's needle mass per window (the head with the most at
    the shortest length where the run's needle was measured), ``needle_first_top``, the same
    head's mass from the first answer query alone, and with ``ranked_sinks`` rank each
    layer's heads by the run's mean sink mass at each length."""
    top: dict[str, tuple[int, int]] = {}
    for n in sorted(measured):
        for _, run, m in measured[n]:
            heads = m.get("needle_heads")
            if run["run"] not in top and heads is not None and len(heads):
                mean = np.asarray(heads).mean(axis=0)  # (layers, H)
                top[run["run"]] = tuple(int(i) for i in np.unravel_index(int(np.argmax(mean)), mean.shape))
    for entries in measured.values():
        for _, run, m in entries:
            for heads, picked in (("needle_heads", "needle_top"), ("needle_first_heads", "needle_first_top")):
                if run["run"] in top and m.get(heads) is not None and len(m[heads]):
                    m[picked] = np.asarray(m[heads])[(slice(None), *top[run["run"]])]
            if ranked_sinks and m.get("sink_heads") is not None and len(m["sink_heads"]):
                heads = np.asarray(m["sink_heads"])  # (W, layers, H)
                order = np.argsort(-heads.mean(axis=0), axis=-1, kind="stable")
                m["sink_heads"] = np.take_along_axis(heads, order[None], axis=-1)


def _retrieval_head_per_run(measured: dict[int, list[tuple]]) -> dict[str, dict]:
    """Each run's retrieval head per length: its mean needle mass over the run's windows, over
    those whose needle is farthest from the question (the smallest depth; None where the cell
    does not say its depths), and from the first answer query alone (None where the cache
    predates that measure). A row pools learned and unlearned seeds alike; these keep them
    apart."""
    per_run: dict[str, dict] = {}
    for n, entries in sorted(measured.items()):
        for cell, run, m in entries:
            if "needle_top" not in m:
                continue
            top, depths, far = np.asarray(m["needle_top"], dtype=np.float64), cell.get("needle_depths"), None
            if depths is not None and len(depths) == len(top) and None not in depths:
                depths = np.asarray(depths, dtype=np.float64)
                far = (float(depths.min()), float(top[depths == depths.min()].mean()))
            first = float(np.mean(m["needle_first_top"])) if "needle_first_top" in m else None
            per_run.setdefault(run["name"], {"seed": run["seed"], "lengths": {}})["lengths"][n] = (float(top.mean()), far,
                                                                                                 first)
    return per_run


def _needle_by_depth(entries: list[tuple]) -> dict[float, dict]:
    """The retrieval head's needle mass pooled per needle depth, where every run's cell says
    the depth of each of its needle windows (caches written before it did say nothing)."""
    per_run = []
    for cell, _, m in entries:
        depths = cell.get("needle_depths")
        if "needle_top" not in m or depths is None or len(depths) != len(m["needle_top"]) or None in depths:
            return {}
        per_run.append((np.asarray(depths, dtype=np.float64), np.asarray(m["needle_top"])))
    found = sorted({float(d) for depths, _ in per_run for d in depths})
    return {d: pool([values[depths == d] for depths, values in per_run], 1.0) for d in found}


def _intervals(rows: list[dict]) -> list[str]:
    """How each row's intervals were made, rows that share a way named together."""
    ways: dict[str, list[str]] = {}
    for row in rows:
        pooled = next((p for cells in row["lengths"].values() for p in cells.values() if p), None)
        if pooled is None:
            continue
        how = (f"across {pooled['n']} runs (seeds; t-interval over the per-seed means)" if pooled["across"] == "runs"
               else f"across the {pooled['n']} windows of one run (t-interval; these trained weights only)")
        ways.setdefault(how, []).append(f"`{row['label']}`")
    return [f"- {how}: {', '.join(labels)}." for how, labels in ways.items()]


def _notes(rows: list[dict]) -> list[str]:
    """What each row did not measure, and why; a reason shared by several lengths is said once."""
    lines = []
    for row in rows:
        if row["attention"] != "softmax":
            lines.append(f"- `{row['label']}`: {LINEAR}.")
        at: dict[str, list[int]] = {}
        for n, notes in row["notes"].items():
            for note in notes:
                at.setdefault(note, []).append(n)
        lines += [f"- `{row['label']}` at {', '.join(map(str, lengths))}: {note}" for note, lengths in at.items()]
        for note in sorted({r["needle_note"] for r in row["runs"] if "needle_note" in r}):
            lines.append(f"- `{row['label']}`, needle: {note}.")
    return lines


def _markdown(results: dict, rows: list[dict], out: Path) -> str:
    lengths = sorted({n for row in rows for n in row["lengths"]})
    runs = results["runs"]
    epsilons = sorted({r["epsilon"] for r in runs})
    sink_tokens = sorted({r["sink_tokens"] for r in runs})
    first = "the first token" if sink_tokens == [1] else f"the first {'/'.join(map(str, sink_tokens))} tokens"
    remade = (f" Made again {results['remade']} from its results.json (ropelab regenerate)."
              if results.get("remade") else "")
    softmax = [r for r in rows if r["lengths"] and any("entropy" in c for c in r["lengths"].values())]
    lines = ["# Attention diagnostics", "",
             "What attention does as the length grows, at the training length L and beyond: entropy, attended "
             "distance, attention sinks, where RoPE's q·k norm sits across frequencies, and attention on a "
             f"passkey's needle. docs/diagnostics.md defines each measure and its source.{remade} "
             f"{regenerate_line(out)}", *incomplete_note(results.get("missing")), *summary_section(softmax, lengths), "",
             "## Runs", "", *provenance(runs), "", "| run | row | encoding | attention | seed | sample | commit | seconds |",
             "|---|---|---|---|---:|---|---|---:|"]
    for r in runs:
        lines.append(f"| {r['name']} | {r['label']} | {r['encoding']} | {r.get('attention', 'softmax')} | {r['seed']} "
                     f"| {'; '.join(filter(None, (r.get('sample'), r.get('needle_sample'))))} | {(r.get('git_commit') or '')[:10]} | {r['eval_seconds']:.0f} |")
    lines += ["", "Every number is a mean with its 95% interval in brackets (cut to the range the measure can take: "
                  "≥ 0, and ≤ 1 for fractions of attention or of heads):", "", *_intervals(rows)]
    if softmax:
        plot_entropy_distance(softmax, uniform_entropy, uniform_distance, out / "entropy_distance.png")
        shown = [rows[0]["train_len"], lengths[-1]]
        plot_position_entropy(softmax, shown, out / "entropy_by_position.png")
        plot_distance_histogram(softmax, shown, out / "distance_histogram.png")
        plot_sink_heatmaps(softmax, shown, epsilons[0], out / "sink_heads.png")
        lines += ["", "## Entropy", "",
                  "Mean attention entropy (nats) over layers, heads and queries; uniform causal attention has "
                  "ln(i + 1) at query i.", "", *table(softmax, lengths, "entropy", ".3f", uniform_entropy), "",
                  "![entropy and attended distance against length](entropy_distance.png)", "",
                  "![entropy by query position](entropy_by_position.png)", "",
                  "## Attended distance", "", "Mean attended distance Σ_j p_ij (i − j) in tokens, over layers, heads "
                  "and queries; uniform causal attention has (T − 1)/4.", "",
                  *table(softmax, lengths, "distance", ".1f", uniform_distance), "",
                  "![attention mass by distance](distance_histogram.png)", "",
                  "## Attention sinks", "",
                  f"Sink mass: the mean attention on {first} over layers and heads. Sink rate (Gu et al. 2025): the "
                  f"fraction of heads whose mean attention on it exceeds ε = {', '.join(map(str, epsilons))}.", "",
                  "Sink mass:", "", *table(softmax, lengths, "sink", ".3f"), "",
                  "Sink rate (fraction of heads above ε):", "", *table(softmax, lengths, "sink_rate", ".2f"), "",
                  "![sink mass by layer and head](sink_heads.png)"]
    lines += _type_section(softmax, lengths)
    lines += needle_section(rows, lengths, out) + _pair_section(rows, out) + _map_section(rows, out, bool(results.get("remade")))
    notes = _notes(rows)
    if notes:
        lines += ["", "## Not measured", "", *notes]
    if results["missing"]:
        lines += ["", "## Missing runs", "", *missing_lines(results["missing"])]
    return "\n".join(lines) + "\n"


def _type_section(rows: list[dict], lengths: list[int]) -> list[str]:
    """A layer plan's entropy, attended distance and sink mass per layer type (each type's
    layers only), beside the same over all its layers in the tables above."""
    typed = [r for r in rows if r["runs"][0].get("layer_types")]
    if not typed:
        return []
    lines = ["", "## By layer type", "",
             "For each layer plan, the measures above over the layers of one type only (its windowed, NoPE or "
             "global layers apart). The type's letter is the plan's (the row name ends with the pattern)."]
    for name, fmt, what in (("entropy", ".3f", "Entropy (nats)"), ("distance", ".1f", "Attended distance (tokens)"),
                            ("sink", ".3f", "Sink mass")):
        lines += ["", f"{what}:", "", *header(["row", "layer type"], [], typed[0]["train_len"], lengths)]
        for row in typed:
            for kind in sorted(set(row["runs"][0]["layer_types"])):
                measure = f"{name}@{kind}"
                lines.append(f"| {row['label']} | {kind} | " + " | ".join(
                    cell_text(row["lengths"].get(n, {}).get(measure), fmt) for n in lengths) + " |")
    return lines


def _pair_section(rows: list[dict], out: Path) -> list[str]:
    found = [r for r in rows if "qk_share" in r["lengths"].get(r["train_len"], {})]
    if not found:
        return []
    plot_pair_shares(found, out / "qk_by_frequency.png")
    lines = ["", "## q·k norm by RoPE frequency pair", "",
             "Each rotation pair i's share of Σ_i E‖q⁽ⁱ⁾‖·E‖k⁽ⁱ⁾‖ per head (Barbero et al. 2025), averaged over heads, "
             "at L. Pair 0 turns fastest. Below: the share of the lowest- and of the highest-frequency quarter of the "
             "pairs, mean over layers.", "", "| row | lowest-frequency quarter | highest-frequency quarter |", "|---|---:|---:|"]
    for row in found:
        share = row["lengths"][row["train_len"]]["qk_share"]
        quarter = max(1, np.asarray(share["mean"]).shape[-1] // 4)
        low = {k: None if share[k] is None else np.asarray(share[k])[:, -quarter:].sum(-1).mean()
               for k in ("mean", "low", "high")}
        high = {k: None if share[k] is None else np.asarray(share[k])[:, :quarter].sum(-1).mean()
                for k in ("mean", "low", "high")}
        lines.append(f"| {row['label']} | {cell_text(low, '.3f')} | {cell_text(high, '.3f')} |")
    return lines + ["", "![q·k norm by frequency pair](qk_by_frequency.png)"]


def _map_section(rows: list[dict], out: Path, remade: bool = False) -> list[str]:
    """The example maps, drawn from the runs' cells; a report made again from its results.json
    (which keeps no maps; the same rows in the same order) links the figures drawn beside it
    when the runs' caches were at hand."""
    lines, kept = [], False
    for i, row in enumerate(rows):
        maps = {n: m for n, m in row.get("map", {}).items() if m is not None}
        name = f"attention_map_{i}.png"
        if maps:
            plot_attention_maps(row, maps, out / name)
        elif remade and (out / name).is_file():
            kept = True
        else:
            continue
        lines += ["", f"![attention maps of {row['label']}]({name})"]
    if lines:
        lines = ["", "## Example attention maps", "",
                 "One window (the first run of each row), each layer's attention averaged over its heads and over "
                 "blocks of the map; colour on a log scale." + (" Drawn when the runs' caches were at hand (results.json "
                                                                "keeps no maps)." if kept else "")] + lines
    return lines


DIAGNOSTIC_FIGURES = ("entropy_distance.png", "entropy_by_position.png", "distance_histogram.png", "sink_heads.png",
                      "needle_mass.png", "qk_by_frequency.png", "attention_map_*.png")


def jsonable(value):
    """``value`` as results.json holds it: string keys, lists for tuples and arrays, floats (and
    arrays' values) rounded to 6 decimals, a NaN float as null."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return np.round(value, 6).tolist()
    if isinstance(value, (np.floating, float)):
        return None if math.isnan(float(value)) else round(float(value), 6)
    return value


def _reduced(cell: dict, meta: dict) -> dict:
    """One run's cell at one length as results.json keeps it: its status and notes, and each
    measure per window (``window_measures``)."""
    kept = {k: v for k, v in cell.items() if not isinstance(v, (list, np.ndarray))}
    if cell.get("status") != "ok":
        return kept
    for name in ("needle_uniform", "needle_depths"):
        if name in cell:
            kept[name] = cell[name]
    return kept | window_measures(cell, meta) | {"per_window": True}


def write_diagnostics_report(results: dict, out: Path, carried: tuple[Path, ...] = ()) -> None:
    """report.md, results.json (the runs' cells and the pooled rows) and figures in ``out``;
    ``carried``: example maps of the report made again elsewhere (write_report_files)."""
    # results.json keeps each run's measures per window as the pooling reads them
    # (window_measures), not the per-head, per-position arrays they come from, nor the example
    # maps: those stay in the runs' caches (and a grid's records); kept here they made a study
    # of 60 runs tens of MB. The rows are pooled from the cells exactly as kept (rounded), so a
    # report made again from its results.json (eval.remake) gives the same numbers.
    kept = kept_results(results)
    rows = pooled_rows(kept)
    _example_maps(rows, results["cells"])
    pooled = [{k: v for k, v in row.items() if k not in ("runs", "map")} | {"runs": [r["run"] for r in row["runs"]]}
              for row in rows]

    def write_markdown() -> str:
        markdown = _markdown(results, rows, out)
        write_text_atomic(out / "report.md", markdown)
        return markdown

    write_report_files(out, jsonable({**kept, "rows": pooled}), write_markdown, DIAGNOSTIC_FIGURES, carried)


def kept_results(results: dict) -> dict:
    """``results`` with each run's cells as results.json keeps them: reduced per window and
    rounded (``_reduced``, ``jsonable``)."""
    metas = {meta["run"]: meta for meta in results["runs"]}
    cells = {run: {n: jsonable(_reduced(cell, metas[run])) for n, cell in by_length.items()}
             for run, by_length in results["cells"].items()}
    return {**results, "cells": cells}


def _example_maps(rows: list[dict], cells: dict) -> None:
    """Each row's example map per length, from its first run with an ok cell there: read from
    the runs' full cells (a results.json keeps none, so a remade report has None)."""
    for row in rows:
        for n in row["lengths"]:
            ok = [c for c in (cells[r["run"]].get(str(n)) for r in row["runs"]) if c and c["status"] == "ok"]
            row.setdefault("map", {})[n] = ok[0].get("map") if ok else None
