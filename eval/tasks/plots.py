"""Figures for task reports: accuracy vs length per task, heatmaps over length (needle depth
× length for passkey and multikey, first-error position × length for copy and addition), and
each seed's accuracy at L during training."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ropelab.eval.reporting.labels import label_order  # noqa: E402
from ropelab.eval.lm.plots import (PlainFormatter, plain_ticks, finish, mark_train_len, row_styles,  # noqa: E402
                                   style)


def plot_accuracy(table: dict[str, dict[int, dict]], train_lens: list[int], path: Path, title: str,
                  encodings: Optional[dict[str, str]] = None) -> None:
    """Accuracy vs length (log-x), one line per row in its encoding's colour (``encodings``: row ->
    encoding), 95% intervals (seeds and instances) as error bars; each training length marked."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    styles = row_styles(sorted(table, key=label_order), encodings)
    for i, label in enumerate(sorted(table, key=label_order)):
        points = sorted((n, c) for n, c in table[label].items() if "accuracy" in c)
        if not points:
            continue
        xs = [n for n, _ in points]
        ys = np.array([c["accuracy"] for _, c in points])
        err = np.array([[y - c["ci_low"] for y, (_, c) in zip(ys, points)],
                        [c["ci_high"] - y for y, (_, c) in zip(ys, points)]]).clip(min=0)  # rounding at 0 and 1
        ax.errorbar(xs, ys, yerr=err, markersize=3.5, capsize=2, label=label, **styles[label])
    mark_train_len(ax, *train_lens)
    ax.set_xscale("log", base=2)
    plain_ticks(ax, "x")
    ax.set_ylim(-0.03, 1.03)
    finish(fig, ax, "evaluated length (positions)", "exact-match accuracy (95% interval)", title, path)


def panels(labels: list[str], width: float, height: float, **subplots):
    """(fig, axes, [(ax, label)]) for a panel per row label, three to a row, each titled with its
    label (wrapped, so a long row name stays over its panel); the grid's spare panels hidden.
    ``width``: the figure's extra width beyond the panels'; ``height``: one row's."""
    cols = min(3, len(labels))
    rows = (len(labels) + cols - 1) // cols
    # Constrained layout leaves room for a colour bar beside the panels (tight_layout cannot).
    fig, axes = plt.subplots(rows, cols, figsize=(max(5.0, 4.2 * cols) + width, height * rows), squeeze=False,
                             layout="constrained", **subplots)
    for ax, label in zip(axes.flat, labels):
        ax.set_title("\n".join(textwrap.wrap(label, 48)), fontsize=9)
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    return fig, axes, list(zip(axes.flat, labels))


def plot_heatmaps(grids: dict[str, tuple[list, list[int], np.ndarray]], path: Path, title: str,
                  ylabel: str = "needle depth", scale: str = "accuracy") -> None:
    """One panel per row label, a row per y value (a depth, or a bin's name) and a column per
    length: the value in colour (the colour bar's scale, 0 to 1) and digits, NaN (n/a) grey."""
    fig, axes, drawn = panels(sorted(grids, key=label_order), 1.0, 3.0)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")  # n/a cells
    for ax, label in drawn:
        depths, lengths, acc = grids[label]
        image = ax.imshow(np.ma.masked_invalid(acc), cmap=cmap, vmin=0, vmax=1, aspect="auto", origin="upper")
        for (i, j), value in np.ndenumerate(acc):
            text, colour = ("n/a", "black") if np.isnan(value) else (f"{value:.2f}", "white" if value < 0.6 else "black")
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [d if isinstance(d, str) else f"{d:g}" for d in depths], fontsize=7)
        ax.set_xlabel("length", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
    fig.colorbar(image, ax=axes, label=scale, shrink=0.9)  # every panel shares vmin 0, vmax 1
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_learning(curves: dict[str, dict[int, tuple[list[int], list[float]]]], threshold: float, path: Path,
                  title: str) -> None:
    """Validation accuracy at L against training step: a panel per row label, a line per seed
    (``curves``: label -> seed -> (steps, accuracies)), the stop's threshold dashed. A line that
    ends before the budget stopped at competence; one that runs to the end did not."""
    labels = sorted(curves, key=label_order)
    fig, axes, drawn = panels(labels, 0.0, 2.8, sharex=True, sharey=True)
    cols = axes.shape[1]
    for ax, label in drawn:
        for i, seed in enumerate(sorted(curves[label])):
            steps, accuracy = curves[label][seed]
            st = style(i)
            ax.plot(steps, accuracy, color=st["color"], linestyle=st["linestyle"], linewidth=1.1, alpha=0.9,
                    label=f"seed {seed}")
        ax.axhline(threshold, color="grey", linestyle="--", linewidth=0.8, label=f"stop at {threshold:g}")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="upper left")
        ax.xaxis.set_major_formatter(PlainFormatter())
    for col in range(cols):  # the lowest panel drawn in each column carries the step axis
        lowest = axes[(len(labels) - 1 - col) // cols, col]
        lowest.xaxis.set_tick_params(labelbottom=True)
        lowest.set_xlabel("training step", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy at L", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=130)
    plt.close(fig)
