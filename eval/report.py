"""Turn extrapolation results into report.md, results.json and PNG plots.

Rows are an encoding (plus RoPE scaling); runs that share a config but differ in seed
are one row, shown as mean ± std over seeds. Each cell also gives the ratio to the
row's in-distribution perplexity (at the training length), so "stays flat" and "blows up"
read at a glance. Lengths a learned table cannot serve read "n/a (trained table: N
positions)" and are left out of the plots.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Optional

import numpy as np

from eval.labels import row_label
from eval.plots import plot_per_position, plot_perplexity

PROTOCOL_TITLES = {
    "nonoverlap": "Non-overlapping windows (ALiBi paper protocol)",
    "sliding": "Sliding window (each scored token has ≥ L−S tokens of context)",
}


def _group(rows: list[dict], protocol: str) -> dict[str, dict[int, list[dict]]]:
    """label -> length -> rows (one per seed)."""
    table: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["protocol"] == protocol:
            table[row_label(row)][row["length"]].append(row)
    return table


def _mean_std(values: list[float]) -> tuple[float, Optional[float]]:
    mean = float(np.mean(values))
    return mean, (float(np.std(values, ddof=1)) if len(values) > 1 else None)


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return "inf"
    return f"{value:.1f}" if value >= 100 else f"{value:.2f}"


def summarize(rows: list[dict], protocol: str, key: str = "ppl") -> dict[str, dict[int, dict]]:
    """label -> length -> {mean, std, ratio, seeds, na} for one protocol."""
    out: dict[str, dict[int, dict]] = {}
    for label, by_length in _group(rows, protocol).items():
        train_len = next(iter(by_length.values()))[0]["train_len"]
        cells = {}
        for length, group in by_length.items():
            ok = [r[key] for r in group if r["status"] == "ok" and r.get(key) is not None]
            if not ok:
                cells[length] = {"na": group[0].get("note", "n/a")}
                continue
            mean, std = _mean_std(ok)
            cells[length] = {"mean": mean, "std": std, "seeds": len(ok)}
        base = cells.get(train_len, {}).get("mean")
        for cell in cells.values():
            if "mean" in cell and base:
                cell["ratio"] = cell["mean"] / base
        out[label] = cells
    return out


def markdown_table(summary: dict[str, dict[int, dict]], lengths: list[int], train_len: int,
                   ratios: bool = True) -> str:
    head = "| encoding | " + " | ".join(f"{n}{' (L)' if n == train_len else ''}" for n in lengths) + " |"
    lines = [head, "|---|" + "---:|" * len(lengths)]
    for label in sorted(summary):
        cells = []
        for n in lengths:
            cell = summary[label].get(n)
            if cell is None:
                cells.append("–")
            elif "na" in cell:
                cells.append(f"n/a ({cell['na']})")
            else:
                text = _fmt(cell["mean"]) + (f" ± {cell['std']:.2g}" if cell["std"] is not None else "")
                if ratios and "ratio" in cell and n != train_len:
                    text += f" (×{cell['ratio']:.2f})"
                cells.append(text)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _tokens_line(rows: list[dict], protocol: str, lengths: list[int]) -> str:
    counts = {}
    for r in rows:
        if r["protocol"] == protocol and r["status"] == "ok":
            counts.setdefault(r["length"], r["tokens"])
    return "Tokens scored per length: " + ", ".join(f"{n}: {counts[n]:,}" for n in lengths if n in counts) + "."


def write_report(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    rows = results["results"]
    lengths = sorted({r["length"] for r in rows})
    train_lens = sorted({r["train_len"] for r in rows})
    train_len = train_lens[0]
    protocols = [p for p in ("nonoverlap", "sliding") if any(r["protocol"] == p for r in rows)]
    md = ["# Length extrapolation report", "",
          f"Created {results['created']}. Training length L = {', '.join(map(str, train_lens))}; "
          "cells are perplexity (mean ± std over seeds where there are several) and, in "
          "brackets, the ratio to the same row's perplexity at L.", ""]
    md += ["## Runs", "", "| run | encoding | seed | params | tokens trained | train length | commit |",
           "|---|---|---:|---:|---:|---:|---|"]
    for run in results["runs"]:
        md.append(f"| {run['name']} | {run['encoding']} | {run['seed']} | {run['params']:,} | "
                  f"{(run['tokens_trained'] or 0):,} | {run['train_len']} | {(run['git_commit'] or '')[:10]} |")
    if results.get("missing"):
        md += ["", "**Missing runs** (not in the tables):", ""]
        md += [f"- {m['run']}: {m['error']}" for m in results["missing"]]
    for protocol in protocols:
        md += ["", f"## {PROTOCOL_TITLES[protocol]}", "", "### Perplexity", "",
               markdown_table(summarize(rows, protocol), lengths, train_len), "",
               "### Bits per byte", "", markdown_table(summarize(rows, protocol, "bpb"), lengths, train_len,
                                                        ratios=False), "",
               _tokens_line(rows, protocol, lengths), "",
               f"![perplexity vs length]({_plot_name(protocol)})"]
    if any(results["per_position"].values()):
        md += ["", "## Loss by position", "", "![per-position loss](per_position.png)"]
    md += ["", "Notes: RoPE scalings use factor = L_eval / L_train (plain RoPE up to L). In a "
           "fixed-window evaluation dynamic NTK sees one length per window, so it equals static NTK "
           "at scale s·L/L_train − (s−1)."]
    (out / "report.md").write_text("\n".join(md) + "\n")
    for protocol in protocols:
        plot_perplexity(summarize(rows, protocol), train_len, out / _plot_name(protocol),
                        PROTOCOL_TITLES[protocol])
    if any(results["per_position"].values()):
        plot_per_position(results, train_len, out / "per_position.png")


def _plot_name(protocol: str) -> str:
    return f"ppl_vs_length_{protocol}.png"
