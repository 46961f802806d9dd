"""Figures of the attention diagnostics (eval/diagnostics/report.py draws them).

Every figure colours a row by its encoding (``eval.plots.encoding_color``, the same colour in
every figure); rows that share an encoding differ by marker and dash. Legends sit beside
the axes, where they hide no data. Rows are the report's pooled rows: per length, each
measure's mean with its 95% interval (eval/diagnostics/report.py: ``pool``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.ticker import LogLocator

from ropelab.eval.diagnostics.attention_stats import bin_edges
from ropelab.eval.lm.plots import DASHES, MARKERS, encoding_color, mark_train_len, plain_ticks

UNIFORM = "black"  # the uniform-attention reference: not NoPE's grey (model/encodings.py), nor any encoding's colour

MAP_FLOOR = 1e-4  # the attention maps' colour scale starts here (a uniform row over 8L = 1024 keys is ~1e-3)


def row_styles(rows: list[dict]) -> dict[str, dict]:
    """Colour by encoding; marker and dash by the row's place among rows of that encoding
    (linear attention dashed)."""
    seen: dict[str, int] = {}
    styles = {}
    for row in rows:
        j = seen.get(row["encoding"], 0)
        seen[row["encoding"]] = j + 1
        dash = DASHES[(j + (row["attention"] != "softmax")) % len(DASHES)]
        styles[row["label"]] = {"color": encoding_color(row["encoding"]), "marker": MARKERS[j % len(MARKERS)],
                                "linestyle": dash}
    return styles


def _save(fig, path: Path, handles=None, labels=None) -> None:
    """The legend to the right of every panel, then the file (cropped to what is drawn)."""
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def _unique_legend(axes) -> tuple[list, list]:
    handles, labels = [], []
    for ax in np.ravel(axes):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    return handles, labels


def _against_length(ax, rows: list[dict], name: str, styles: dict, index=(), mark: bool = True) -> None:
    """Each row's ``name`` against length with its 95% interval as error bars (``index``: of an
    array-valued measure), L marked."""
    for row in rows:
        points = [(n, cells[name]) for n, cells in sorted(row["lengths"].items()) if cells.get(name)]
        if not points:
            continue
        xs = np.array([n for n, _ in points], dtype=float)
        mean = np.array([float(np.asarray(p["mean"])[index]) for _, p in points])
        low = np.array([float(np.asarray(p["low"])[index]) if p["low"] is not None else np.nan for _, p in points])
        high = np.array([float(np.asarray(p["high"])[index]) if p["high"] is not None else np.nan for _, p in points])
        err = np.nan_to_num(np.array([mean - low, high - mean]))
        ax.errorbar(xs, mean, yerr=err, capsize=2, markersize=4, linewidth=1.2, label=row["label"],
                    **styles[row["label"]])
    ax.set_xscale("log", base=2)
    plain_ticks(ax, "x")
    if mark:
        mark_train_len(ax, rows[0]["train_len"])
    ax.grid(True, which="both", alpha=0.3)


def plot_entropy_distance(rows: list[dict], uniform_entropy: Callable[[int], float],
                          uniform_distance: Callable[[int], float], path: Path) -> None:
    """Mean entropy and mean attended distance against length, one line per row, uniform attention dashed."""
    styles = row_styles(rows)
    lengths = sorted({n for row in rows for n in row["lengths"]})
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.2))
    for ax, name, uniform, ylabel in ((axes[0], "entropy", uniform_entropy, "attention entropy (nats)"),
                                      (axes[1], "distance", uniform_distance, "mean attended distance (tokens)")):
        ax.plot(lengths, [uniform(n) for n in lengths], color=UNIFORM, linestyle="--", linewidth=1,
                label="uniform attention")
        _against_length(ax, rows, name, styles)
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel(ylabel + ", 95% interval")
    _log_y(axes[1])
    axes[0].set_title("Entropy: mean over layers, heads and queries", fontsize=10)
    axes[1].set_title("Attended distance Σ p·(i − j): mean over layers, heads, queries", fontsize=10)
    _save(fig, path, *_unique_legend(axes))


def _log_y(ax) -> None:
    """A log y axis ticked at 1, 2, 5 × powers of ten, in plain numbers."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    plain_ticks(ax, "y")


def _bin_centres(length: int) -> np.ndarray:
    """Keys visible to the queries of each query-index bin (i + 1), at the bin's geometric middle."""
    edges = bin_edges(length)
    return np.array([math.sqrt((a + 1) * b) for a, b in zip(edges[:-1], edges[1:])])


def plot_position_entropy(rows: list[dict], lengths: list[int], path: Path) -> None:
    """Entropy against the query's position (log-binned), at L and at the longest length, with 95% bands."""
    styles = row_styles(rows)
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.2 * len(lengths), 4.2), squeeze=False, sharey=True)
    for ax, n in zip(axes[0], lengths):
        x = _bin_centres(n)
        ax.plot(x, [np.log(np.arange(a, b) + 1).mean() for a, b in zip(bin_edges(n)[:-1], bin_edges(n)[1:])],
                color=UNIFORM, linestyle="--", linewidth=1, label="uniform attention")
        for row in rows:
            p = row["lengths"].get(n, {}).get("entropy_by_position")
            if p is None:
                continue
            line, = ax.plot(x, p["mean"], linewidth=1.2, markersize=3.5, label=row["label"], **styles[row["label"]])
            if p["low"] is not None:
                ax.fill_between(x, p["low"], p["high"], color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_xscale("log", base=2)
        plain_ticks(ax, "x")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("keys the query sees, i + 1 (log-spaced bins)")
        ax.set_title(f"at {n} tokens" + (" (L)" if n == rows[0]["train_len"] else ""), fontsize=10)
    axes[0, 0].set_ylabel("attention entropy (nats), 95% band")
    _save(fig, path, *_unique_legend(axes))


def _distance_labels(length: int) -> list[str]:
    edges = bin_edges(length)
    return [str(a) if b - a == 1 else f"{a}–{b - 1}" for a, b in zip(edges[:-1], edges[1:])]


def plot_distance_histogram(rows: list[dict], lengths: list[int], path: Path) -> None:
    """The attention mass per distance bin, at L and at the longest length (95% intervals)."""
    styles = row_styles(rows)
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.6 * len(lengths), 4.2), squeeze=False, sharey=True)
    for ax, n in zip(axes[0], lengths):
        labels = _distance_labels(n)
        x = np.arange(len(labels))
        edges = bin_edges(n)
        uniform = [np.mean([max(0, min(i + 1, b) - a) / (i + 1) for i in range(n)]) for a, b in zip(edges, edges[1:])]
        ax.plot(x, uniform, color=UNIFORM, linestyle="--", linewidth=1, label="uniform attention")
        for row in rows:
            p = row["lengths"].get(n, {}).get("distance_histogram")
            if p is None:
                continue
            err = None if p["low"] is None else [p["mean"] - p["low"], p["high"] - p["mean"]]
            ax.errorbar(x, p["mean"], yerr=err, capsize=2, markersize=3.5, linewidth=1.2, label=row["label"],
                        **styles[row["label"]])
        ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=7)
        _log_y(ax)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("distance i − j (tokens)")
        ax.set_title(f"at {n} tokens" + (" (L)" if n == rows[0]["train_len"] else ""), fontsize=10)
    axes[0, 0].set_ylabel("attention mass per distance bin, 95% interval")
    _save(fig, path, *_unique_legend(axes))


def plot_sink_heatmaps(rows: list[dict], lengths: list[int], epsilon: float, path: Path) -> None:
    """Per row and length, the mean attention on the first token(s) of every layer × head."""
    fig, axes = plt.subplots(len(rows), len(lengths), figsize=(3.4 * len(lengths) + 1.2, 2.5 * len(rows) + 0.4),
                             squeeze=False, layout="constrained")
    image = None
    for r, row in enumerate(rows):
        for c, n in enumerate(lengths):
            ax = axes[r, c]
            p = row["lengths"].get(n, {}).get("sink_heads")
            if p is None:
                ax.text(0.5, 0.5, f"{row['label']} at {n}:\nnot measured (see the report)", ha="center",
                        va="center", fontsize=8, color="grey", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            alpha = np.asarray(p["mean"])  # (layers, H)
            image = ax.imshow(alpha, vmin=0, vmax=1, cmap="viridis", aspect="auto")
            for (i, j), value in np.ndenumerate(alpha):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6.5,
                        color="white" if value < 0.6 else "black")
            ax.set_xticks(range(alpha.shape[1]))
            ax.set_yticks(range(alpha.shape[0]))
            ax.set_xlabel("head, ranked by sink mass within its layer, per run" if row.get("sinks_ranked") else "head",
                          fontsize=8)
            ax.set_ylabel("layer", fontsize=8)
            ax.set_title(f"{row['label']} at {n}: {int((alpha > epsilon).sum())}/{alpha.size} heads > ε",
                         fontsize=8.5, color=encoding_color(row["encoding"]))
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label=f"mean attention on the first token(s) (ε = {epsilon:g})")
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def plot_needle(rows: list[dict], path: Path) -> None:
    """Attention on the passkey's key tokens against length: the mean head, and each run's head
    with the most at its shortest length measured (L where the prompt fits), followed to the
    longer lengths and pooled over the row's runs; the row's uniform-attention mass dotted."""
    styles = row_styles(rows)
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.2), sharey=True)
    for row in rows:
        measured = sorted(n for n, cells in row["lengths"].items() if cells.get("needle"))
        for ax in axes:
            ax.plot(measured, [row["uniform"][n] for n in measured], color=styles[row["label"]]["color"],
                    linestyle=":", marker="_", markersize=12, linewidth=1)
    _against_length(axes[1], rows, "needle_top", styles)
    _against_length(axes[0], rows, "needle", styles)
    axes[0].set_title("mean over layers and heads", fontsize=10)
    axes[1].set_title("each run's head with the most at the shortest length (fixed)", fontsize=10)
    for ax in axes:
        _log_y(ax)
        ax.set_xlabel("evaluation length (tokens)")
    axes[0].set_ylabel("attention mass on the needle's tokens, 95% interval\n(dotted: uniform attention)")
    _save(fig, path, *_unique_legend(axes))


def plot_pair_shares(rows: list[dict], path: Path) -> None:
    """Each rotation pair's share of the q·k norm at L, one row of panels per RoPE-family row,
    one panel per layer; pairs that do not turn (p-RoPE's frequency 0) hatched."""
    n_layers = max(np.asarray(r["lengths"][r["train_len"]]["qk_share"]["mean"]).shape[0] for r in rows)
    fig, axes = plt.subplots(len(rows), n_layers, figsize=(3.3 * n_layers, 2.6 * len(rows) + 0.6),
                             squeeze=False, sharey=True, layout="constrained")
    for r, row in enumerate(rows):
        share = row["lengths"][row["train_len"]]["qk_share"]
        run = row["runs"][0]
        # A layer plan measures its rotary layers only, each with its own frequencies (Gemma 3's two bases).
        rotary = run.get("rotary_layers") or list(range(np.asarray(share["mean"]).shape[0]))
        for layer, ax in enumerate(axes[r]):
            if layer >= len(rotary):
                ax.set_visible(False)
                continue
            frequencies = np.asarray(run.get("layer_frequencies", {}).get(str(rotary[layer]), run["frequencies"]))
            mean = np.asarray(share["mean"])[layer]
            x = np.arange(len(mean))
            # A share is ≥ 0: an interval reaching below (two seeds: t with one degree of freedom) is drawn to 0.
            err = None if share["low"] is None else [mean - np.maximum(np.asarray(share["low"])[layer], 0),
                                                     np.asarray(share["high"])[layer] - mean]
            bars = ax.bar(x, mean, yerr=err, width=0.8, color=encoding_color(row["encoding"]), alpha=0.85,
                          error_kw={"elinewidth": 0.8, "capsize": 1.5})
            for bar, frequency in zip(bars, frequencies):
                if frequency == 0:
                    bar.set_hatch("///")
                    bar.set_facecolor("lightgrey")
            ticks = sorted({0, len(mean) // 4, len(mean) // 2, 3 * len(mean) // 4, len(mean) - 1})
            ax.set_xticks(ticks, [f"{i}\n{_wavelength(frequencies[i])}" for i in ticks], fontsize=7)
            kind = f" ({run['layer_types'][rotary[layer]]})" if run.get("layer_types") else ""
            ax.set_title(f"{row['label']}, layer {rotary[layer]}{kind}", fontsize=9, color=encoding_color(row["encoding"]))
            ax.grid(True, axis="y", alpha=0.3)
        axes[r, 0].set_ylabel("share of Σ E‖q‖·E‖k‖\n(95% interval)")
    for ax in axes[-1]:
        ax.set_xlabel("pair i (top) and its wavelength\n2π/θᵢ in tokens (hatched: not rotated)", fontsize=8)
    axes[0, 0].set_ylim(bottom=0)  # once every bar is drawn: the axes share y
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def _wavelength(frequency: float) -> str:
    if frequency == 0:
        return "∞"
    wavelength = 2 * math.pi / frequency
    return f"{wavelength:.0f}" if wavelength < 1e4 else f"{wavelength:.0e}"


def plot_attention_maps(row: dict, maps: dict[int, list], path: Path) -> None:
    """One window's head-averaged attention of every layer, at each length in ``maps`` (a row of panels each)."""
    lengths = sorted(maps)
    n_layers = len(maps[lengths[0]])
    fig, axes = plt.subplots(len(lengths), n_layers, figsize=(2.7 * n_layers + 1.2, 2.8 * len(lengths) + 0.3),
                             squeeze=False, layout="constrained")
    cmap = plt.get_cmap("magma").with_extremes(bad="white")  # white: the masked future, where attention is 0
    image = None
    for r, n in enumerate(lengths):
        for layer, ax in enumerate(axes[r]):
            data = np.ma.masked_less_equal(np.asarray(maps[n][layer]), 0)
            image = ax.imshow(data, cmap=cmap, norm=LogNorm(vmin=MAP_FLOOR, vmax=1), extent=(0, n, n, 0),
                              interpolation="nearest")
            ax.set_title(f"layer {layer}, {n} tokens" + (" (L)" if n == row["train_len"] else ""), fontsize=9)
            ax.tick_params(labelsize=7)
        axes[r, 0].set_ylabel("query position", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("key position", fontsize=8)
    fig.suptitle(f"{row['label']}: attention (mean over heads)", color=encoding_color(row["encoding"]), fontsize=11)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention probability (block mean, log scale)")
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
