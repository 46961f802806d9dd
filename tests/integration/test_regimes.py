"""eval/regime_compare.py: one table over several regime grids, each run and reported by ablate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from helpers.runs import synthetic_grid, write_grid
from ropelab.eval.lm import regime_compare
from ropelab.eval.lm.context_use import breakdown, breakdown_text, context_gain, position_bins
from ropelab.eval.reporting.tables import summarize
from ropelab.scripts import ablate


def write_regime(tmp: Path, corpus: Path, name: str, seq_len: int) -> Path:
    return write_grid(tmp, corpus, name=name,
                      overrides=["train.max_steps=12", "train.eval_interval=12", "train.ckpt_interval=12",
                                 f"train.seq_len={seq_len}"],
                      variants={"rope": ["model.pos.kind=rope"]}, axes={"train.seed": [0, 1]},
                      eval={"length_multipliers": [1, 1.5, 2, 4], "protocols": ["nonoverlap", "same-tokens"],
                            "scalings": ["none"], "max_tokens": 512},
                      report=tmp / "reports" / name)

@pytest.fixture(scope="module")
def two_regimes(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("regimes")
    grids = [write_regime(tmp, corpus, "regime-short", 32), write_regime(tmp, corpus, "regime-long", 64)]
    for grid in grids:
        assert ablate.main([str(grid), "--jobs", "1", "--no-estimate"]) == 0
    return tmp, grids


def test_one_row_per_regime_and_row_with_the_reports_own_numbers(two_regimes, capsys):
    tmp, grids = two_regimes
    assert regime_compare.main([str(g) for g in grids] + ["--out", str(tmp / "pilot")]) == 0
    table = (tmp / "pilot" / "README.md").read_text()
    assert table == capsys.readouterr().out.rstrip("\n") + "\n"
    rows = [line for line in table.splitlines() if line.startswith("| regime-")]
    assert [r.split(" | ")[0:2] for r in rows] == [["| regime-short", "rope"], ["| regime-long", "rope"]]
    for grid, row, train_len in zip(grids, rows, (32, 64)):
        results = json.loads((tmp / "reports" / grid.stem / "results.json").read_text())
        corpus = results["results"][0]["corpus"]
        cells = row.split(" | ")
        assert cells[3] == str(train_len) and cells[6] == "2"  # L, seeds
        gain = context_gain(position_bins(results, corpus)["rope"])
        assert cells[8].startswith(f"{gain.point:.3f} (")  # the gain with its interval across the 2 runs
        low, high = (float(x) for x in cells[8].split("(")[1].rstrip(")").split(" to "))
        summary = summarize(results, corpus, "same-tokens")
        at_l = summary["rope"][train_len]
        bits = at_l["bpb"][0] / math.log(at_l["ppl"])  # bits per byte of text per nat per token: bpb / ln ppl at L
        assert float(cells[10].split(" (")[0]) == pytest.approx(gain.point * bits, abs=1e-3)
        b_low, b_high = (float(x) for x in cells[10].split("(")[1].rstrip(")").split(" to "))
        assert b_low == pytest.approx(low * bits, abs=2e-3) and b_high == pytest.approx(high * bits, abs=2e-3)
        assert b_low < float(cells[10].split(" (")[0]) < b_high
        found = breakdown(summary, "rope")
        assert cells[11] == breakdown_text(found)
        assert cells[13].startswith("4L: ")


def test_a_grid_not_yet_reported_is_a_clear_error(tmp_path, corpus, capsys):  # needs no trained regime
    grid = write_regime(tmp_path, corpus, "regime-unrun", 16)
    assert regime_compare.main([str(grid)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "results.json does not exist" in err


def test_a_grid_of_tasks_alone_is_said_to_have_no_perplexity_report(tmp_path, capsys):
    """Its report is in tasks/; the message said only that results.json does not exist."""
    assert regime_compare.main([str(synthetic_grid(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "trains on synthetic tasks only, so it has a task report" in err and "no perplexity report" in err


def test_attention_table_from_the_grids_diagnostics_and_a_line_for_those_without(two_regimes, capsys):
    from ropelab.scripts import diagnose

    tmp, grids = two_regimes
    runs = sorted(str(p) for p in (tmp / "runs" / "regime-short").iterdir() if p.is_dir())
    out = tmp / "reports" / "regime-short" / "diagnostics"
    assert diagnose.main([*runs, "--lengths", "32", "64", "128", "--windows", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert regime_compare.main([str(g) for g in grids]) == 0
    text = capsys.readouterr().out
    assert "## Attention as the length grows" in text
    rows = [line for line in text.split("## Attention")[1].splitlines() if line.startswith("| regime-")]
    assert len(rows) == 1 and rows[0].startswith("| regime-short | rope | 4L | ")  # 128 = 4 × 32
    pooled = json.loads((out / "results.json").read_text())["rows"][0]["lengths"]
    cells = rows[0].split(" | ")
    distance = pooled["64"]["distance"]  # at 2L, over uniform attention's (64 - 1) / 4
    assert cells[4] == f"{distance['mean'] / 15.75:.2f} [{distance['low'] / 15.75:.2f}, {distance['high'] / 15.75:.2f}]"
    entropy = pooled["128"]["entropy"]["mean"] / float(np.mean(np.log(np.arange(1, 129))))
    assert cells[8].startswith(f"{entropy:.2f} [")
    assert "No diagnostics in the report of regime-long" in text
    (out / "results.json").write_text("{")
    assert regime_compare.main([str(g) for g in grids]) == 2
    assert "cannot be read as a diagnostics report" in capsys.readouterr().err
    (out / "results.json").unlink()


def test_training_minutes_at_the_usual_speed_do_not_count_a_pause(tmp_path):
    """The regimes table's train minutes: tokens over the median logged tokens/s, so a run
    stopped for an hour (one slow log interval) reads as long as one that was not."""
    from ropelab.training.metrics import steady_train_seconds
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 10, "tokens_per_sec": 1000.0}, {"step": 20, "tokens_per_sec": 990.0},
             {"step": 25, "val_loss": 3.0}, {"step": 30, "tokens_per_sec": 3.5},  # the stopped interval
             {"step": 40, "tokens_per_sec": 1010.0}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n{\"step\": 50, \"tokens_per")
    assert steady_train_seconds(path, 4000) == pytest.approx(4000 / 995.0)
    assert steady_train_seconds(path, None) is None and steady_train_seconds(tmp_path / "none", 4000) is None
    from ropelab.eval.lm.regime_compare import train_seconds
    recorded = {"run": str(tmp_path), "tokens_trained": 4000, "train_seconds": 3600.0}  # results before the record
    assert train_seconds(recorded) == pytest.approx(4000 / 995.0)  # read from the run's metrics.jsonl
    assert train_seconds({**recorded, "steady_train_seconds": 5.0}) == 5.0
    assert train_seconds({**recorded, "run": str(tmp_path / "gone")}) == 3600.0  # the run not at hand
    from ropelab.eval.lm.regime_compare import at_usual_speed
    assert at_usual_speed(recorded) and at_usual_speed({**recorded, "run": "gone", "steady_train_seconds": 5.0})
    assert not at_usual_speed({**recorded, "run": str(tmp_path / "gone")})  # the table marks it "(wall)"
