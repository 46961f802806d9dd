"""Report figures: tick labels, the paired-ratio figure's rows and ceiling, the heatmap's colour bar."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ropelab.eval.lm.plots import RATIO_CEILING, plain_labels, plain_number, plot_paired, plot_training
from ropelab.eval.tasks.plots import plot_heatmaps


def test_plot_labels_and_paired_figure(tmp_path):
    """Tick labels read as numbers (powers of two in full); the paired figure draws each row
    against the reference only, and says which rows run past its ceiling."""
    assert [plain_number(v) for v in (64, 1024, 2048, 20_000, 2_048_000, 0.5)] == \
        ["64", "1024", "2048", "20k", "2.048M", "0.5"]
    def ratio(point, low, high):  # what the figure reads of a comparison (eval/reporting/tables.py: Comparison)
        return SimpleNamespace(ratio=point, interval=(low, high))

    comparisons = {"alibi vs rope": {128: ratio(0.99, 0.98, 1.0), 2048: ratio(0.81, 0.79, 0.83)},
                   "sinusoidal vs rope": {128: ratio(1.08, 1.07, 1.09), 2048: ratio(2.96, 2.4, 3.5)},
                   "rope + ntk vs rope + yarn": {2048: ratio(1.0, 0.99, 1.02)},
                   "learned vs rope": {}}
    out = tmp_path / "paired.png"
    entries = plot_paired(comparisons, "rope", [128], out, "t")
    assert entries == ["alibi", f"sinusoidal (beyond ×{RATIO_CEILING:g})"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_paired({"rope + ntk vs rope + yarn": {}}, "rope", [128], tmp_path / "none.png", "t") == []
    assert not (tmp_path / "none.png").exists()


def drawn(monkeypatch, plot, *args):
    """The figure ``plot`` draws (kept open instead of closed) after a draw."""
    import ropelab.eval.lm.plots
    figures = []
    monkeypatch.setattr(ropelab.eval.lm.plots.plt, "close", figures.append)
    plot(*args)
    (fig,) = figures
    fig.canvas.draw()
    return fig


def test_an_axis_has_one_tick_format(tmp_path, monkeypatch):
    """Tokens up to 20k read 0, 5k, 10k, … (never "5000" beside "10k"); lengths below 10k in full."""
    assert plain_labels([0, 5000, 10_000, 15_000]) == ["0", "5k", "10k", "15k"]
    assert plain_labels([256, 1024, 8192]) == ["256", "1024", "8192"]
    assert plain_labels([512, 8192, 16_384]) == ["512", "8.192k", "16.384k"]
    assert plain_labels([0, 500_000, 1_000_000, 1_500_000]) == ["0", "0.5M", "1M", "1.5M"]
    curves = {"rope": {"tokens": [0, 4000, 8000, 12_000, 16_000, 20_000], "loss": [5.0, 4.0, 3.5, 3.2, 3.0, 2.9],
                       "val_tokens": [20_000], "val_loss": [3.0]}}
    fig = drawn(monkeypatch, plot_training, curves, tmp_path / "t.png")
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    labels = [t.get_text() for t, x in zip(ax.get_xticklabels(), ax.get_xticks()) if low <= x <= high]
    assert labels[-1] == "20k" and all(text == "0" or text.endswith("k") for text in labels), labels


def test_tick_labels_of_values_that_are_not_finite():
    """A NaN among the values chose no unit (StopIteration from inside a report)."""
    assert plain_labels([float("nan"), 5.0]) == ["nan", "5"]
    assert plain_labels([float("inf"), 20_000.0])[1] == "20k"

def test_the_passkey_heatmap_has_a_colour_bar(tmp_path, monkeypatch):
    grids = {label: ([0.0, 1.0], [32, 64], np.array([[1.0, 0.5], [np.nan, 0.0]])) for label in ("alibi", "rope")}
    fig = drawn(monkeypatch, plot_heatmaps, grids, tmp_path / "h.png", "passkey")
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 1 and bars[0].get_ylabel() == "accuracy"
    assert bars[0].get_ylim() == (0.0, 1.0)  # every panel on one scale


def test_a_row_has_its_encodings_colour_in_every_figure(tmp_path, monkeypatch):
    """ALiBi is one colour in the perplexity, accuracy and diagnostics figures alike: its row in the
    table of encodings (model/encodings.py). Rows of one encoding (RoPE and its scalings) differ by
    dash pattern, and a row of no known encoding takes a colour no encoding has, never black."""
    from ropelab.eval.lm import plots
    from ropelab.eval.lm.plots import encoding_color, plot_perplexity, row_styles
    from ropelab.eval.reporting.labels import label_encodings
    from ropelab.eval.tasks import plots as task_plots

    encodings = {"alibi": "alibi", "rope": "rope", "rope + yarn": "rope", "mystery": ""}
    styles = row_styles(sorted(encodings), encodings)
    assert styles["alibi"]["color"] == encoding_color("alibi") != encoding_color("rope")
    assert styles["rope"]["color"] == styles["rope + yarn"]["color"] == encoding_color("rope")
    assert styles["rope"]["linestyle"] != styles["rope + yarn"]["linestyle"]
    assert styles["mystery"]["color"] not in {encoding_color(k) for k in ("alibi", "rope", "none")} | {"#000000"}
    # The order of the rows beside it does not change a row's colour.
    assert row_styles(["alibi", "zeta"], {"alibi": "alibi"})["alibi"]["color"] == styles["alibi"]["color"]
    results = {"runs": [{"name": "a_seed-0", "label": "alibi", "encoding": "alibi"}],
               "results": [{"encoding": "rope", "scaling": "yarn"}]}
    assert label_encodings(results) == {"alibi": "alibi", "rope + yarn": "rope"}

    drawn = {}

    def keep(fig, ax, *args):  # the colour of each drawn line, by its legend entry
        drawn.update({line.get_label(): line.get_color() for line in ax.get_lines()})
        for container in ax.containers:
            drawn[container.get_label()] = container.lines[0].get_color()

    monkeypatch.setattr(plots, "finish", keep)
    monkeypatch.setattr(task_plots, "finish", keep)
    cell = {"ppl": 10.0, "low": 9.0, "high": 11.0}
    plot_perplexity({"alibi": {128: cell}, "rope": {128: cell}}, [128], tmp_path / "p.png", "t", encodings)
    assert drawn["alibi"] == encoding_color("alibi") and drawn["rope"] == encoding_color("rope")
    drawn.clear()
    acc = {"accuracy": 0.5, "ci_low": 0.4, "ci_high": 0.6}
    task_plots.plot_accuracy({"rope": {32: acc}, "alibi": {32: acc}}, [32], tmp_path / "a.png", "t", encodings)
    assert drawn["alibi"] == encoding_color("alibi") and drawn["rope"] == encoding_color("rope")
