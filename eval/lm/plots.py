"""Matplotlib figures for extrapolation reports (headless: the Agg backend).

Lines that coincide (e.g. a RoPE scaling that is plain RoPE up to L_train) stay visible:
each row gets its own marker and dash pattern, drawn slightly transparent. Axes are
labelled in plain numbers (128, 1k, 2M), never powers, in one format per axis (never "5000"
beside "10k").
"""

from __future__ import annotations

import zlib

import math

from collections import defaultdict
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import Formatter, FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402

from ropelab.eval.reporting.labels import encoding_label, with_scaling  # noqa: E402
from ropelab.eval.reporting.intervals import pooled_curve  # noqa: E402
from ropelab.model.encodings import KINDS  # noqa: E402


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
DASHES = ("-", "--", "-.", ":")


# tab20's dark shades first, then its light ones: 20 colours before one repeats.
COLORS = tuple(plt.get_cmap("tab20").colors[j] for j in (*range(0, 20, 2), *range(1, 20, 2)))
LEGEND_INSIDE_MAX = 8  # more entries than this go beside the axes, where they hide no line


def style(i: int, label: str = "") -> dict:
    """Row ``i``'s colour, marker, dash pattern and transparency, so coinciding lines stay visible
    (for lines that are runs or heads, not encodings: ``row_styles`` colours rows by encoding)."""
    dashes = DASHES[(i // len(MARKERS) + ("+" in label)) % len(DASHES)]
    return {"color": COLORS[i % len(COLORS)], "marker": MARKERS[i % len(MARKERS)], "linestyle": dashes,
            "alpha": 0.85}


def row_styles(labels: list[str], encodings: Optional[dict[str, str]] = None) -> dict[str, dict]:
    """Each row's style in a figure that draws rows: its encoding's colour (``encoding_color``, from
    the table of encodings, so a row has the same colour in every figure of every report), its
    own marker, and a dash pattern that tells apart the rows of one colour (RoPE and its
    scalings, a sweep's settings). A row of no known encoding takes a colour no encoding has."""
    out, per_colour = {}, defaultdict(int)
    spare = iter(PLAN_COLORS * (len(labels) // len(PLAN_COLORS) + 1))
    for i, label in enumerate(labels):
        colour = encoding_color((encodings or {}).get(label, ""))
        if colour == UNKNOWN_COLOR:
            colour = next(spare)
        out[label] = {"color": colour, "marker": MARKERS[i % len(MARKERS)],
                      "linestyle": DASHES[per_colour[colour] % len(DASHES)], "alpha": 0.85}
        per_colour[colour] += 1
    return out


def plain_number(value: float, _=None) -> str:
    """128, 2048, 20k, 2.5M: a tick label a person reads at a glance (whole numbers below
    10,000 in full, so powers of two read 1024 and 2048, not 1.024k)."""
    if abs(value) < 1e4 and float(value).is_integer():
        return f"{int(value)}"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


UNITS = ((1e9, "G"), (1e6, "M"), (1e3, "k"))


def plain_labels(values, largest: Optional[float] = None) -> list[str]:
    """Tick labels of one axis in one format: every tick in full (plain_number) while all are
    below 10,000; else every tick from 1,000 up in the unit of the largest (k, M or G), so an
    axis never reads "5000" beside "10k". ``largest``: the largest tick shown (default: of ``values``)."""
    largest = max((abs(v) for v in values if math.isfinite(v)), default=0.0) if largest is None else abs(largest)
    if not math.isfinite(largest):  # NaN or inf: no unit describes it
        largest = 0.0
    if largest < 1e4:
        return [plain_number(v) for v in values]
    scale, suffix = next((scale, suffix) for scale, suffix in UNITS if largest >= scale)
    return [f"{v / scale:g}{suffix}" if abs(v) >= 1e3 else plain_number(v) for v in values]


class PlainFormatter(Formatter):
    """Major tick labels by plain_labels, in the unit of the largest tick inside the view
    (a locator also places ticks beyond it, which are not drawn)."""

    def __call__(self, value, pos=None) -> str:
        return plain_number(value)

    def format_ticks(self, values) -> list[str]:
        low, high = sorted(self.axis.get_view_interval()) if self.axis is not None else (-np.inf, np.inf)
        shown = [abs(v) for v in values if low <= v <= high] or [abs(v) for v in values]
        return plain_labels(values, max(shown, default=0.0))


def plain_ticks(ax, axis: str) -> None:
    """Log axes labelled 128, 1k, … rather than 2^7, 10^3, …; minor ticks unlabelled."""
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_formatter(PlainFormatter())
    target.set_minor_formatter(NullFormatter())


def mark_train_len(ax, *train_lens: int) -> None:
    """A dotted vertical line at the training length, labelled; one per length where rows were
    trained at several (a fine-tune beside its parent), each labelled with its length."""
    distinct = sorted(set(train_lens))
    for train_len in distinct:
        ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
        label = " L_train" if len(distinct) == 1 else f" L_train={train_len}"
        ax.text(train_len, 0.98, label, transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="grey")


def finish(fig, ax, xlabel: str, ylabel: str, title: str, path: Path) -> None:
    """Labels, grid and legend of a one-panel figure, then write it to ``path``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    labels = len(ax.get_legend_handles_labels()[1])
    if labels > LEGEND_INSIDE_MAX:
        fig.set_size_inches(fig.get_size_inches()[0] + 2.5, fig.get_size_inches()[1])
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    elif labels:  # a panel with nothing drawn (e.g. no seed learned the task) has no legend
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def length_errorbar(ax, i: int, label: str, lengths, values, lows, highs, entry: str = "",
                    st: Optional[dict] = None) -> None:
    """Row ``i``'s values against evaluation length with their 95% intervals as error bars,
    nudged sideways by row so that bars at one length do not hide each other; ``st``: its
    style (``row_styles``)."""
    xs = np.asarray(lengths, dtype=float) * (1 + 0.012 * (i % 5 - 2))
    values, lows, highs = (np.asarray(a, dtype=float) for a in (values, lows, highs))
    ax.errorbar(xs, values, yerr=[values - lows, highs - values], markersize=4, capsize=2, linewidth=1.1,
                label=entry or label, **(st or style(i, label)))


def plot_perplexity(summary: dict[str, dict[int, dict]], train_lens: list[int], path: Path, title: str,
                    encodings: Optional[dict[str, str]] = None) -> None:
    """Perplexity vs evaluation length (log-log), one line per row, 95% intervals as error bars;
    ``encodings``: row -> its encoding, whose colour the row takes (``row_styles``)."""
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = row_styles(sorted(summary), encodings)
    for i, label in enumerate(sorted(summary)):
        points = sorted((n, c) for n, c in summary[label].items() if "ppl" in c)
        if not points:
            continue
        length_errorbar(ax, i, label, [n for n, _ in points], [c["ppl"] for _, c in points],
                        [c["low"] for _, c in points], [c["high"] for _, c in points], st=styles[label])
    mark_train_len(ax, *train_lens)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_ticks(ax, "x")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    plain_ticks(ax, "y")
    finish(fig, ax, "evaluation length (tokens)", "perplexity (95% interval across runs)", title, path)


RATIO_CEILING = 2.5  # the paired-ratio figure's top: rows far above it would flatten the rest


def plot_paired(comparisons: dict[str, dict], reference: str, train_lens: list[int], path: Path,
                title: str, encodings: Optional[dict[str, str]] = None) -> list[str]:
    """Each row's perplexity relative to ``reference`` on the same tokens, against length, with the
    95% interval across training runs (across documents for a one-seed row; eval/reporting/tables.py
    Comparison): the figure of the comparison table, where the perplexity figure's
    document-level spread hides differences of a few percent.

    The axis stops at ×2.5 so that a row far above it does not flatten the others; such a row
    is drawn as far as the axis goes and its legend entry says it leaves the chart. Returns the
    legend entries; none (and no file) when no row is compared with ``reference``.
    """
    suffix = f" vs {reference}"
    series = {name[: -len(suffix)]: cells for name, cells in comparisons.items() if name.endswith(suffix) and cells}
    if not series:  # the reference is the only row: nothing to draw, no file
        return []
    fig, ax = plt.subplots(figsize=(8, 5))
    lows, highs, entries = [1.0], [1.0], []
    styles = row_styles(sorted(series), encodings)
    for i, label in enumerate(sorted(series)):
        lengths = sorted(series[label])
        ratio = [series[label][n].ratio for n in lengths]
        low, high = zip(*(series[label][n].interval for n in lengths))
        entries.append(label + (f" (beyond ×{RATIO_CEILING:g})" if max(high) > RATIO_CEILING else ""))
        length_errorbar(ax, i, label, lengths, ratio, low, high, entry=entries[-1], st=styles[label])
        lows.append(min(low))
        highs.append(min(max(high), RATIO_CEILING))
    ax.axhline(1.0, color="black", linewidth=0.8, label=f"{reference} (×1)")
    mark_train_len(ax, *train_lens)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(min(lows) / 1.03, max(highs) * 1.03)
    plain_ticks(ax, "x")
    times = FuncFormatter(lambda v, _: f"×{v:.3g}")
    ax.yaxis.set_major_formatter(times)
    ax.yaxis.set_minor_formatter(times)
    finish(fig, ax, "evaluation length (tokens)",
           f"perplexity / {reference}'s on the same tokens (95% interval across runs)", title, path)
    return entries


def plot_per_position(runs: list[dict], curves: dict[str, dict[str, dict]], train_lens: list[int], path: Path,
                      corpus: str) -> None:
    """Mean loss by position bin, pooled over seeds, one line per row (its encoding's colour), with
    a 95% band; the training length marked and labelled."""
    labels = {r["run"]: r.get("label") or encoding_label(r["encoding"], r.get("attention", "softmax")) for r in runs}
    pooled: dict[str, list[dict]] = defaultdict(list)
    encodings = {}
    for run, by_scaling in curves.items():
        for scaling, curve in by_scaling.items():
            if curve:
                pooled[with_scaling(labels[run], scaling)].append(curve)
                encodings[with_scaling(labels[run], scaling)] = next(r["encoding"] for r in runs if r["run"] == run)
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = row_styles(sorted(pooled), encodings)
    for i, label in enumerate(sorted(pooled)):
        same = [c for c in pooled[label] if c["edges"] == pooled[label][0]["edges"]]
        edges = np.asarray(same[0]["edges"], dtype=float)
        centres = np.sqrt(edges[:-1] * (edges[1:] - 1).clip(min=1))
        mean, low, high = pooled_curve(same)
        line, = ax.plot(centres, mean, label=label, linewidth=1.1, markersize=3.5, **styles[label])
        ax.fill_between(centres, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
    mark_train_len(ax, *train_lens)
    ax.set_xscale("log", base=2)
    plain_ticks(ax, "x")
    finish(fig, ax, "position in window (1-based; log-spaced bins)", "mean loss (nats), 95% band",
           f"{corpus}: loss by position at the longest evaluated length", path)


def plot_budget(cells: dict[str, dict[int, dict[int, dict]]], lengths: list[int], path: Path, corpus: str,
                encodings: Optional[dict[str, str]] = None) -> None:
    """Perplexity against fine-tuning steps, one panel per length, one line per row (95% intervals)."""
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.5 * len(lengths), 4.5), squeeze=False)
    steps = sorted({s for by_step in cells.values() for s in by_step})
    styles = row_styles(sorted(cells), encodings)
    for ax, length in zip(axes[0], lengths):
        for i, row in enumerate(sorted(cells)):
            points = sorted((s, c[length]) for s, c in cells[row].items() if "ppl" in c.get(length, {}))
            if not points:
                continue
            xs = [s for s, _ in points]
            ys = np.array([c["ppl"] for _, c in points])
            err = np.array([[c["ppl"] - c["low"] for _, c in points], [c["high"] - c["ppl"] for _, c in points]])
            ax.errorbar(xs, ys, yerr=err, markersize=3.5, capsize=2, linewidth=1.2, label=row, **styles[row])
        ax.set_xscale("symlog", linthresh=50)
        ax.set_yscale("log")
        ax.set_xticks(steps)  # the evaluated checkpoints themselves
        ax.xaxis.set_major_formatter(PlainFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 7.0)))
        plain_ticks(ax, "y")
        ax.set_xlabel("fine-tuning steps")
        ax.set_ylabel("perplexity (95% interval)")
        ax.set_title(f"{corpus}: at {length} tokens", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_training(curves: dict[str, dict[str, list]], path: Path, encodings: Optional[dict[str, str]] = None) -> None:
    """Training loss (thin line) and validation loss (markers) against tokens trained, a line per
    run in its encoding's colour (``row_styles``): an ablation's runs side by side, from their
    metrics.jsonl."""
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = row_styles(sorted(curves), encodings)
    for i, label in enumerate(sorted(curves)):
        curve = curves[label]
        st = styles[label]
        ax.plot(curve["tokens"], curve["loss"], linewidth=0.9, alpha=0.8, linestyle=st["linestyle"],
                color=st["color"], marker=st["marker"], markevery=[], label=label)  # the marker shows in the legend
        if curve["val_tokens"]:
            ax.plot(curve["val_tokens"], curve["val_loss"], linestyle="none", marker=st["marker"], markersize=4,
                    color=st["color"], alpha=0.9)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    plain_ticks(ax, "y")
    ax.xaxis.set_major_formatter(PlainFormatter())
    finish(fig, ax, "tokens trained", "loss (nats per token)",
           "Training loss (lines) and validation loss (markers)", path)


def plot_position_bias(panels: list[dict], path: Path) -> None:
    """One panel per run: each head's score bias relative to distance 0 against distance
    (log x), the training length marked (scripts/position_bias.py)."""
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False, sharex=True)
    for ax, panel in zip(axes.flat, panels):
        rel = np.asarray(panel["relative_bias"])
        distance = np.arange(1, rel.shape[1])
        for h, values in enumerate(rel):
            ax.plot(distance, values[1:], linewidth=1.2, label=f"head {h}")
        ax.set_xscale("log")
        plain_ticks(ax, "x")
        mark_train_len(ax, panel["train_len"])
        ax.set_title(f"{panel['name']} ({panel['encoding']})", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("bias − bias at distance 0")
    for ax in axes[-1]:
        ax.set_xlabel("distance i − j")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# One colour per encoding (``model.pos.kind``), the same in every figure that draws rows by
# encoding (the attention diagnostics: eval/diagnostics/plots.py): tab10's ten colours, the
# RoPE family in blues, score biases in warm colours, absolute encodings in greens.
def encoding_color(encoding: str) -> str:
    """The colour of ``encoding``: a ``pos.kind``'s from its row of model/encodings.py; a layer
    plan's (``ModelConfig.encoding_name``) one of PLAN_COLORS, picked by its name (so the same
    plan has the same colour in every report); black for anything else."""
    if encoding in KINDS:
        return KINDS[encoding].color
    if encoding.endswith("]") and " [" in encoding:
        return PLAN_COLORS[zlib.crc32(encoding.encode()) % len(PLAN_COLORS)]
    return UNKNOWN_COLOR


UNKNOWN_COLOR = "#000000"
# tab20b's darker half and tab20c's: none of them an encoding's colour.
PLAN_COLORS = ("#5254a3", "#8ca252", "#8c6d31", "#bd9e39", "#843c39", "#ad494a",
               "#7b4173", "#a55194", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363")
