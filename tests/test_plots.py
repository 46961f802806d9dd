"""Report figures: tick labels, and the paired-ratio figure's rows and ceiling."""

from __future__ import annotations

from eval.plots import RATIO_CEILING, plain_number, plot_paired


def test_plot_labels_and_paired_figure(tmp_path):
    """Tick labels read as numbers (powers of two in full); the paired figure draws each row
    against the reference only, and says which rows run past its ceiling."""
    assert [plain_number(v) for v in (64, 1024, 2048, 20_000, 2_048_000, 0.5)] == \
        ["64", "1024", "2048", "20k", "2.048M", "0.5"]
    comparisons = {"alibi vs rope": {128: (0.99, 0.98, 1.0, "▼"), 2048: (0.81, 0.79, 0.83, "▼")},
                   "sinusoidal vs rope": {128: (1.08, 1.07, 1.09, "▲"), 2048: (2.96, 2.4, 3.5, "▲")},
                   "rope + ntk vs rope + yarn": {2048: (1.0, 0.99, 1.02, "~")},
                   "learned vs rope": {}}
    out = tmp_path / "paired.png"
    entries = plot_paired(comparisons, "rope", 128, out, "t")
    assert entries == ["alibi", f"sinusoidal (beyond ×{RATIO_CEILING:g})"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_paired({"rope + ntk vs rope + yarn": {}}, "rope", 128, tmp_path / "none.png", "t") == []
    assert not (tmp_path / "none.png").exists()
