"""Matplotlib figures for extrapolation reports (headless: the Agg backend)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from eval.labels import encoding_label, with_scaling  # noqa: E402


def plot_perplexity(summary: dict[str, dict[int, dict]], train_len: int, path: Path, title: str) -> None:
    """Perplexity vs evaluation length (log-x, log-y), one line per row, ± std as error bars."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label in sorted(summary):
        points = sorted((n, c) for n, c in summary[label].items() if "mean" in c)
        if not points:
            continue
        xs = [n for n, _ in points]
        ys = [c["mean"] for _, c in points]
        err = [c["std"] or 0.0 for _, c in points]
        ax.errorbar(xs, ys, yerr=err, marker="o", markersize=3.5, capsize=2, label=label,
                    linestyle="--" if "+" in label else "-")
    ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
    ax.text(train_len, 0.98, " L_train", transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def log_binned(curve: np.ndarray, bins: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """Means of ``curve`` over log-spaced position bins: (bin centres as 1-based positions, means).

    Early positions change fast and late ones are noisy (few windows), so equal widths on
    a log axis show both.
    """
    edges = np.unique(np.round(np.geomspace(1, len(curve) + 1, bins + 1)).astype(int))
    centres = np.sqrt(edges[:-1] * (edges[1:] - 1).clip(min=1))
    means = np.array([curve[a - 1:b - 1].mean() for a, b in zip(edges[:-1], edges[1:])])
    return centres, means


def plot_per_position(results: dict, train_len: int, path: Path) -> None:
    """Mean loss by position (log-binned), averaged over seeds, one line per row."""
    curves: dict[str, list[np.ndarray]] = defaultdict(list)
    runs = {r["run"]: r for r in results["runs"]}
    for run, by_scaling in results["per_position"].items():
        for scaling, curve in by_scaling.items():
            if curve:
                meta = runs[run]
                label = meta.get("label") or encoding_label(meta["encoding"], meta.get("attention", "softmax"))
                curves[with_scaling(label, scaling)].append(np.asarray(curve))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label in sorted(curves):
        length = min(len(c) for c in curves[label])
        xs, ys = log_binned(np.mean([c[:length] for c in curves[label]], axis=0))
        ax.plot(xs, ys, label=label, linewidth=1.2, linestyle="--" if "+" in label else "-")
    ax.axvline(train_len, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in window (1-based; log-spaced bins)")
    ax.set_ylabel("mean loss (nats)")
    ax.set_title("Loss by position, at each encoding's longest evaluated length", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
