"""The attention-diagnostics command (scripts/diagnose.py): it pools seeds, skips what does not
apply, reuses its cache, remakes a report from its results.json, refuses bad input in one
line with exit 2, and diagnoses synthetic runs and grids on their own lengths."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from ropelab import train
from ropelab.common.errors import ConfigError
from ropelab.configs.grid import load_grid
from helpers.runs import passkey_config, write_grid, write_run_config
from ropelab.scripts import ablate
from ropelab.scripts import diagnose


@pytest.fixture(scope="module")
def diag_runs(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("diag")
    cfg = str(write_run_config(tmp, corpus))
    common = [cfg, "train.max_steps=8", "train.eval_interval=8", "train.ckpt_interval=8"]
    for name, extra in (("rope-a", ["train.seed=1"]), ("rope-b", ["train.seed=2"]),
                        ("alibi", ["model.pos.kind=alibi"]),
                        ("linear", ["model.attention=linear"]),
                        ("learned", ["model.pos.kind=learned", "model.pos.max_len=32"])):
        assert train.main(common + [f"name={name}", *extra]) == 0
    return tmp / "runs"


def test_report_pools_seeds_skips_what_does_not_apply_and_reuses_its_cache(diag_runs, tmp_path, capsys):
    runs = [str(diag_runs / name) for name in ("rope-a", "rope-b", "alibi", "linear", "learned")]
    out = tmp_path / "report"
    assert diagnose.main([*runs, "--lengths", "256", "--windows", "3", "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    results = json.loads((out / "results.json").read_text())
    rows = {row["label"]: row for row in results["rows"]}
    assert set(rows) == {"rope", "alibi", "learned", "rope (linear attention)"}
    assert "- across 2 runs (seeds; t-interval over the per-seed means): `rope`." in report
    assert "- across the 3 windows of one run (t-interval; these trained weights only): `alibi`" in report
    assert rows["rope"]["lengths"]["256"]["entropy"]["across"] == "runs"
    assert "linear attention forms no attention matrix" in report
    assert "`learned` at 256: pos.kind=learned has a table of 32 positions" in report  # skipped, with the reason
    assert "`alibi` at 32: passkey (text wording, 5-digit keys) needs at least" in report  # 252 bytes
    assert "entropy" not in rows["rope (linear attention)"]["lengths"]["32"]
    assert "qk_share" in rows["rope (linear attention)"]["lengths"]["32"] and "qk_share" in rows["rope"]["lengths"]["32"]
    assert "needle" in rows["alibi"]["lengths"]["256"]  # passkey instances in the paper's wording
    for name in ("sink", "sink_rate", "needle", "distance_histogram"):  # fractions: intervals within [0, 1]
        pooled = rows["alibi"]["lengths"]["256"][name]
        assert 0 <= np.min(pooled["low"]) <= np.min(pooled["mean"]) and np.max(pooled["high"]) <= 1
    for figure in ("entropy_distance.png", "entropy_by_position.png", "distance_histogram.png", "sink_heads.png",
                   "qk_by_frequency.png", "needle_mass.png", "attention_map_0.png"):
        assert (out / figure).is_file() and f"]({figure})" in report
    capsys.readouterr()
    assert diagnose.main([*runs, "--lengths", "256", "--windows", "3", "--out", str(out)]) == 0
    assert capsys.readouterr().out.count("reusing") == 5


def test_a_diagnostics_report_is_made_again_from_its_results_json(diag_runs, tmp_path, monkeypatch, capsys):
    """eval.remake on a diagnostics report: the same tables from results.json alone, whether it
    holds the runs' full cells (reports written before results.json kept measures per window)
    or the per-window measures; in place the example maps drawn beside it stay linked."""
    from ropelab.eval.diagnostics import report
    from ropelab.eval.diagnostics import measure as diagnostics
    from ropelab.eval import regenerate
    from ropelab.eval.diagnostics.report import jsonable
    runs = [diag_runs / name for name in ("rope-a", "rope-b", "alibi", "linear")]
    out = tmp_path / "report"
    assert diagnose.main([*map(str, runs), "--lengths", "64", "--windows", "2", "--out", str(out)]) == 0
    original = (out / "report.md").read_text()
    reduced = json.loads((out / "results.json").read_text())

    def tables(text):  # the report without the sentences that say it was made again
        if " Made again" in text:
            text = text.replace(text[text.index(" Made again"):text.index("(ropelab regenerate).") + 21], "")
        text = text.replace(" Drawn when the runs' caches were at hand (results.json keeps no maps).", "")
        return re.sub(r" Regenerate it from its results.json alone: `[^`]*`\.", "", text)  # names where it lies

    def without_maps(text):
        if "## Example attention maps" not in text:
            return text
        head, tail = text.split("\n## Example attention maps", 1)
        return head + ("\n## " + tail.split("\n## ", 1)[1] if "\n## " in tail else "\n")

    original = tables(original)  # the command that regenerates it names where it lies
    regenerate.remake(out)
    again = (out / "report.md").read_text()
    assert "Made again" in again and tables(again) == original
    assert "](attention_map_0.png)" in again and "Drawn when the runs' caches were at hand" in again
    remade = json.loads((out / "results.json").read_text())
    assert remade["cells"] == reduced["cells"] and remade["rows"] == reduced["rows"]  # pooled from what is kept

    # Written between per-window cells and their mark (5850b92..aa51880): no per_window key.
    unmarked = tmp_path / "unmarked"
    unmarked.mkdir()
    (unmarked / "results.json").write_text(json.dumps({**reduced, "cells": {
        run: {n: {k: v for k, v in cell.items() if k != "per_window"} for n, cell in by_length.items()}
        for run, by_length in reduced["cells"].items()}}))
    regenerate.remake(unmarked)
    assert json.loads((unmarked / "results.json").read_text())["rows"] == reduced["rows"]
    # Cells no report can be made from: one line, exit 2.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "results.json").write_text(json.dumps({**reduced, "cells": {
        run: {n: {**cell, "entropy": 7} for n, cell in by_length.items()} for run, by_length in reduced["cells"].items()}}))
    assert regenerate.main([str(broken / "results.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err and "Traceback" not in err and err.count("\n") == 1

    elsewhere = tmp_path / "elsewhere"
    regenerate.remake(out / "results.json", out=elsewhere)  # the maps, which results.json lacks, come along
    assert tables((elsewhere / "report.md").read_text()) == original
    maps = sorted(f.name for f in out.glob("attention_map_*.png"))
    assert maps and sorted(f.name for f in elsewhere.glob("attention_map_*.png")) == maps
    assert all((elsewhere / m).read_bytes() == (out / m).read_bytes() for m in maps)
    nowhere = tmp_path / "nowhere"
    regenerate.remake(unmarked / "results.json", out=nowhere)  # no figure beside it: no map section
    assert "Example attention maps" not in (nowhere / "report.md").read_text()
    assert tables((nowhere / "report.md").read_text()) == without_maps(original)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert regenerate.main([str(out / "results.json"), "--out", str(taken)]) == 2  # not a report's directory
    assert sorted(f.name for f in taken.iterdir()) == ["notes.txt"]
    capsys.readouterr()

    # A results.json with the runs' full cells (per head and position, as the regime pilot's).
    captured = {}
    monkeypatch.setattr(diagnostics, "write_diagnostics_report", lambda results, out: captured.update(results))
    assert diagnose.main([*map(str, runs), "--lengths", "64", "--windows", "2", "--out", str(tmp_path / "unused")]) == 0
    monkeypatch.undo()
    assert "map" in captured["cells"][str(runs[0])]["64"]
    full = tmp_path / "full"
    full.mkdir()
    (full / "results.json").write_text(json.dumps(jsonable(captured)))
    regenerate.remake(full)
    assert without_maps(tables((full / "report.md").read_text())) == without_maps(original)
    rewritten = json.loads((full / "results.json").read_text())
    assert rewritten["cells"] == reduced["cells"]
    assert {"per_window", *report.MEASURES[:3]} <= set(rewritten["cells"][str(runs[0])]["64"])


def test_user_errors_are_one_line_and_exit_2(diag_runs, tmp_path, capsys):
    run = str(diag_runs / "alibi")
    for argv in ([run, "--epsilon", "1.5", "--out", str(tmp_path / "a")],
                 [str(tmp_path / "nothing-here"), "--out", str(tmp_path / "b")]):
        assert diagnose.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1
    (tmp_path / "file").write_text("x")
    assert diagnose.main([run, "--out", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err
    for argv, said in (([run, "--length-multipliers", "1", "0"], "must be a positive number, got 0"),
                       ([run, "--lengths", "64", "--length-multipliers", "2"], "not allowed with argument")):
        with pytest.raises(SystemExit) as e:
            diagnose.main(argv)
        assert e.value.code == 2 and said in capsys.readouterr().err


def test_lengths_as_multiples_of_each_runs_training_length(diag_runs, tmp_path):
    out = tmp_path / "report"
    assert diagnose.main([str(diag_runs / "alibi"), "--length-multipliers", "1", "1.5", "--windows", "2",
                          "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    train_len = results["rows"][0]["train_len"]
    assert sorted(int(n) for n in results["rows"][0]["lengths"]) == [train_len, round(1.5 * train_len)]


def test_a_synthetic_run_is_diagnosed_on_its_task_instances(tmp_path):
    assert train.main([str(passkey_config(tmp_path))]) == 0
    out = tmp_path / "report"
    assert diagnose.main([str(tmp_path / "runs" / "syn"), "--lengths", "64", "--windows", "2", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["runs"][0]["sample"].startswith("2 test instances of passkey")
    cell = results["cells"][results["runs"][0]["run"]]["64"]
    # results.json keeps each measure per window (per head where the report draws heads).
    assert np.asarray(cell["needle_heads"]).shape == (2, 2, 4) and len(cell["needle_uniform"]) == 2
    assert np.asarray(cell["needle"]).shape == (2,) and np.asarray(cell["entropy_by_position"]).shape[0] == 2
    assert "map" not in cell and "qk_pairs" not in cell


@pytest.mark.slow  # trains and diagnoses a grid: about 23 s on 2 quiet cores; CI runs it (-m slow)
def test_a_grid_with_diagnostics_writes_them_into_its_report(tmp_path, capsys):
    grid = write_grid(tmp_path, name="syn-grid", base=passkey_config(tmp_path), file="grid",
                      axes={"model.pos.kind": ["rope", "alibi"]},
                      eval={"length_multipliers": [1], "tasks": {"samples": 2},
                            "diagnostics": {"enabled": True, "windows": 2, "lengths": [64]}},
                      report=tmp_path / "report")
    assert ablate.main([str(grid)]) == 0
    out = capsys.readouterr().out
    assert "diagnostics report" in out and "diagnostics eval (min)" in out
    report = (tmp_path / "report" / "diagnostics" / "report.md").read_text()
    assert "| kind-rope | rope |" in report and "| kind-alibi | alibi |" in report and "## Attention sinks" in report
    grid.write_text(grid.read_text().replace("windows: 2", "windows: 0"))
    with pytest.raises(ConfigError, match="eval.diagnostics.windows must be a positive integer"):
        load_grid(grid)


def test_diagnosed_lengths_follow_each_runs_training_length_unless_set():
    from ropelab.configs.diagnostics import DiagnosticsConfig

    assert DiagnosticsConfig().resolved_lengths(128) == [128, 256, 512, 1024, 2048]
    pilot = DiagnosticsConfig(length_multipliers=[1, 1.5, 2, 8])
    assert pilot.resolved_lengths(128) == [128, 192, 256, 1024]
    assert pilot.resolved_lengths(256) == [256, 384, 512, 2048]  # one setting, runs of two lengths
    assert DiagnosticsConfig(lengths=[300], length_multipliers=[2]).resolved_lengths(128) == [128, 300]
    with pytest.raises(ConfigError, match="length_multipliers must be positive"):
        DiagnosticsConfig(length_multipliers=[1, 0])
    with pytest.raises(ConfigError, match="both are empty"):
        DiagnosticsConfig(length_multipliers=[])
