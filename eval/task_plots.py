"""Figures for task reports: accuracy vs length per task, and heatmaps over length (needle depth
× length for passkey and multikey, first-error position × length for copy and addition)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from eval.labels import label_order  # noqa: E402
from eval.plots import plain_ticks, finish, mark_train_len, style  # noqa: E402


def plot_accuracy(table: dict[str, dict[int, dict]], train_lens: list[int], path: Path, title: str) -> None:
    """Accuracy vs length (log-x), one line per row, 95% intervals (seeds and instances) as error bars;
    each training length marked."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, label in enumerate(sorted(table, key=label_order)):
        points = sorted((n, c) for n, c in table[label].items() if "accuracy" in c)
        if not points:
            continue
        xs = [n for n, _ in points]
        ys = np.array([c["accuracy"] for _, c in points])
        err = np.array([[y - c["ci_low"] for y, (_, c) in zip(ys, points)],
                        [c["ci_high"] - y for y, (_, c) in zip(ys, points)]]).clip(min=0)  # rounding at 0 and 1
        ax.errorbar(xs, ys, yerr=err, markersize=3.5, capsize=2, label=label, **style(i, label))
    mark_train_len(ax, *train_lens)
    ax.set_xscale("log", base=2)
    plain_ticks(ax, "x")
    ax.set_ylim(-0.03, 1.03)
    finish(fig, ax, "evaluated length (positions)", "exact-match accuracy (95% interval)", title, path)


def plot_heatmaps(grids: dict[str, tuple[list, list[int], np.ndarray]], path: Path, title: str,
                  ylabel: str = "needle depth", scale: str = "accuracy") -> None:
    """One panel per row label, a row per y value (a depth, or a bin's name) and a column per
    length: the value in colour (the colour bar's scale, 0 to 1) and digits, NaN (n/a) grey."""
    labels = sorted(grids, key=label_order)
    cols = min(3, len(labels))
    rows = (len(labels) + cols - 1) // cols
    # Constrained layout leaves room for the colour bar beside the panels (tight_layout cannot).
    fig, axes = plt.subplots(rows, cols, figsize=(max(5.0, 4.2 * cols) + 1.0, 3.0 * rows), squeeze=False,
                             layout="constrained")
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")  # n/a cells
    for ax, label in zip(axes.flat, labels):
        depths, lengths, acc = grids[label]
        image = ax.imshow(np.ma.masked_invalid(acc), cmap=cmap, vmin=0, vmax=1, aspect="auto", origin="upper")
        for (i, j), value in np.ndenumerate(acc):
            text, colour = ("n/a", "black") if np.isnan(value) else (f"{value:.2f}", "white" if value < 0.6 else "black")
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [d if isinstance(d, str) else f"{d:g}" for d in depths], fontsize=7)
        ax.set_xlabel("length", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title("\n".join(textwrap.wrap(label, 48)), fontsize=9)  # a long row name stays over its panel
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, label=scale, shrink=0.9)  # every panel shares vmin 0, vmax 1
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=130)
    plt.close(fig)
