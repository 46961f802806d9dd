"""ropelab tune (grid/tune.py): a setting per encoding chosen on validation at L from a finished sweep grid,
each other row set against it by seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.runs import write_grid
from ropelab.configs.grid import load_grid, row_of
from ropelab.scripts import ablate
from ropelab.grid import tune
from ropelab.scripts import tune as tune_command
from ropelab.training.run_dir import RunDir


def sweep(tmp: Path, corpus: Path, seeds=(0, 1, 2)) -> Path:
    return write_grid(tmp, corpus, name="sweep", report=tmp / "report",
                      overrides=["train.max_steps=10", "train.eval_interval=10"],
                      variants={"t5-lr1": ["model.pos.kind=t5"],
                                "t5-lr10": ["model.pos.kind=t5", "train.pos_lr_multiplier=10"],
                                "t5-lr30": ["model.pos.kind=t5", "train.pos_lr_multiplier=30"],
                                "rope": ["model.pos.kind=rope"]},
                      axes={"train.seed": list(seeds)})

def fake_finished(monkeypatch, grid_path: Path, losses: dict[str, list[float]]) -> None:
    """Each run's metrics.jsonl ends with the given validation loss (by row, by seed), and
    every run counts as finished."""
    grid = load_grid(grid_path)
    for run in grid.plan():
        path = RunDir.of(run.cfg).metrics
        path.parent.mkdir(parents=True, exist_ok=True)
        final = losses[row_of(run.name)][run.cfg.train.seed]
        path.write_text("\n".join(json.dumps(e) for e in (
            {"step": 5, "val_loss": final + 1.0}, {"step": 8, "loss": 2.0},
            {"step": 10, "val_loss": final})) + "\n{\"step\": 11, \"val_l")  # a line cut short by a kill
    monkeypatch.setattr(tune, "status", lambda run: ("done", ""))


def test_the_lowest_mean_is_chosen_and_each_other_row_is_set_against_it_by_seed(tmp_path, corpus, monkeypatch):
    grid = sweep(tmp_path, corpus)
    # lr10 beats lr1 in every seed (worse across runs); lr30 differs from lr10 only by noise.
    fake_finished(monkeypatch, grid, {"t5-lr1": [3.00, 3.10, 2.95], "t5-lr10": [2.80, 2.85, 2.76],
                                      "t5-lr30": [2.78, 2.90, 2.79], "rope": [2.7, 2.8, 2.9]})
    found = tune.tune(load_grid(grid))
    t5 = found["encodings"]["t5"]
    assert t5["chosen"] == "t5-lr10" and set(found["encodings"]) == {"t5", "rope"}
    assert found["encodings"]["rope"]["chosen"] == "rope"
    rows = t5["rows"]
    assert rows["t5-lr10"]["mean"] == pytest.approx((2.80 + 2.85 + 2.76) / 3)
    assert rows["t5-lr10"]["overrides"] == ["model.pos.kind=t5", "train.pos_lr_multiplier=10"]
    assert rows["t5-lr1"]["vs_chosen"]["mean"] == pytest.approx(((0.2 + 0.25 + 0.19) / 3))
    assert rows["t5-lr1"]["vs_chosen"]["verdict"] == "worse across training runs"
    assert rows["t5-lr30"]["vs_chosen"]["verdict"] == "undecided at 3 seeds"
    assert "vs_chosen" not in rows["t5-lr10"]
    assert t5["edges"] == [] and found["encodings"]["rope"]["edges"] == []  # 10 lies inside 1-30


def test_a_choice_at_the_end_of_the_range_swept_is_flagged(tmp_path, corpus, monkeypatch, capsys):
    grid = sweep(tmp_path, corpus)
    fake_finished(monkeypatch, grid, {"t5-lr1": [3.00, 3.10, 2.95], "t5-lr10": [2.80, 2.85, 2.76],
                                      "t5-lr30": [2.70, 2.78, 2.69], "rope": [2.7, 2.8, 2.9]})
    assert tune_command.main([str(grid)]) == 0
    out = capsys.readouterr().out
    edge = ("train.pos_lr_multiplier = 30 is the largest value swept (1, 10, 30): a value beyond it may do better; "
            "extend the sweep before a study relies on the choice")
    assert f"Chosen at the edge of the sweep: {edge}." in out
    assert f"note: t5 was chosen at the edge of its sweep: {edge}" in out
    assert json.loads((tmp_path / "report" / "tuning.json").read_text())["encodings"]["t5"]["edges"] == [edge]
    # Two settings are a comparison, not a range: the lower of two is no edge.
    identities = {"a": {"x": 1, "y": 128}, "b": {"x": 1, "y": 512}, "c": {"x": 10, "y": 128}}
    assert tune.sweep_edges("a", identities) == []


def test_unfinished_runs_are_refused_with_the_command_that_finishes_them(tmp_path, corpus, capsys):
    grid = sweep(tmp_path, corpus, seeds=(0,))
    assert tune_command.main([str(grid)]) == 2
    err = capsys.readouterr().err
    assert "4 of the grid's 4 runs are not finished" in err and "ropelab ablate" in err


def test_a_sweep_without_seeds_is_refused(tmp_path, corpus, capsys):
    grid = sweep(tmp_path, corpus, seeds=(0,))
    text = grid.read_text()
    grid.write_text(text[:text.index("axes:")])
    assert tune_command.main([str(grid)]) == 2
    assert "a sweep needs seeds" in capsys.readouterr().err


@pytest.mark.slow  # trains and evaluates a sweep: about 29 s on 2 quiet cores; CI runs it (-m slow)
def test_a_real_sweep_end_to_end(tmp_path, corpus, capsys):
    """Trained by the grid runner, tuned, and the sweep kept beside the grid's report."""
    grid = sweep(tmp_path, corpus, seeds=(0, 1))
    assert ablate.main([str(grid), "--skip-eval", "--no-estimate"]) == 0
    assert tune_command.main([str(grid)]) == 0
    out = capsys.readouterr().out
    assert "chosen, as variant lines for a study grid:" in out and "  rope: [model.pos.kind=rope]" in out
    found = json.loads((tmp_path / "report" / "tuning.json").read_text())
    assert set(found["encodings"]["t5"]["rows"]) == {"t5-lr1", "t5-lr10", "t5-lr30"}
    assert all(len(r["seeds"]) == 2 for r in found["encodings"]["t5"]["rows"].values())
    assert "## t5: " in (tmp_path / "report" / "tuning.md").read_text()


@pytest.mark.slow  # trains seven runs and evaluates them: about 40 s on 2 cores
def test_a_sweep_grows_into_the_study_that_cites_it(tmp_path, corpus, capsys):
    """Tuned, then grown with more_seeds and evaluated: the study's report goes beside the
    sweep's record, which stays (tests/integration/test_bad_input.py checks the directory rule quickly)."""
    grid = sweep(tmp_path, corpus, seeds=(0, 1))
    assert ablate.main([str(grid), "--skip-eval", "--no-estimate"]) == 0
    assert tune_command.main([str(grid)]) == 0
    tuning = (tmp_path / "report" / "tuning.md").read_text()
    grid.write_text(grid.read_text() + "eval: {lengths: [16, 32], max_tokens: 256}\nmore_seeds: {t5-lr1: [2]}\n")
    assert ablate.main([str(grid), "--no-estimate"]) == 0
    assert (tmp_path / "report" / "report.md").is_file() and (tmp_path / "report" / "tuning.md").read_text() == tuning
    assert "t5-lr1_seed-2" in (tmp_path / "report" / "report.md").read_text()


def test_seeds_added_to_the_chosen_row_later_do_not_change_the_choice(tmp_path, corpus, monkeypatch, capsys):
    """A study grows the sweep grid with more_seeds; tuning it again still decides on the
    sweep's seeds, and unfinished added runs do not block it."""
    grid = sweep(tmp_path, corpus, seeds=(0, 1))
    losses = {"t5-lr1": [3.00, 3.10], "t5-lr10": [2.80, 2.85], "t5-lr30": [2.90, 2.95], "rope": [2.7, 2.8]}
    fake_finished(monkeypatch, grid, losses)
    assert tune_command.main([str(grid), "--more-seeds", "2", "3"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("more_seeds:"):]
    assert "  t5-lr10: [2, 3]" in block and "  rope: [2, 3]" in block and "t5-lr1:" not in block
    assert "Not swept (one row each): rope (rope)." in out and "## rope" not in out
    # The added seeds train badly for the chosen row; they are left out of the choice.
    grid.write_text(grid.read_text() + "more_seeds: {t5-lr10: [2, 3]}\n")
    monkeypatch.setattr(tune, "status", lambda run: ("done", "") if run.cfg.train.seed < 2 else ("new", ""))
    found = tune.tune(load_grid(grid))
    assert found["encodings"]["t5"]["chosen"] == "t5-lr10" and found["added_later"] == 2
    assert found["encodings"]["t5"]["rows"]["t5-lr10"]["seeds"] == [0, 1]
    assert "the 2 runs added to rows later (more_seeds) do not change the choice" in tune.report_text(found)


def test_more_seeds_that_repeat_the_sweeps_own_are_refused(tmp_path, corpus, monkeypatch, capsys):
    grid = sweep(tmp_path, corpus, seeds=(0, 1))
    fake_finished(monkeypatch, grid, {"t5-lr1": [3.0, 3.1], "t5-lr10": [2.8, 2.85], "t5-lr30": [2.9, 2.95],
                                      "rope": [2.7, 2.8]})
    assert tune_command.main([str(grid), "--more-seeds", "1", "2"]) == 2
    assert "seeds 1 are the sweep's own; give new ones" in capsys.readouterr().err


def test_the_block_keeps_seeds_the_grid_already_added(tmp_path, corpus, monkeypatch, capsys):
    """Fixed rows given their added seeds while the sweep trained (ablate.py --rows) keep them:
    the printed block, pasted over the grid's own, names every seed once."""
    grid = sweep(tmp_path, corpus, seeds=(0, 1))
    grid.write_text(grid.read_text() + "more_seeds: {rope: [2, 3]}\n")
    fake_finished(monkeypatch, grid, {"t5-lr1": [3.0, 3.1], "t5-lr10": [2.8, 2.85], "t5-lr30": [2.9, 2.95],
                                      "rope": [2.7, 2.8, 2.75, 2.72]})
    assert tune_command.main([str(grid), "--more-seeds", "2", "3", "4"]) == 0
    out = capsys.readouterr().out
    assert "it replaces the grid's own more_seeds block" in out
    block = out[out.index("more_seeds:"):out.index("\nwrote")]
    assert block.splitlines()[1:] == ["  rope: [2, 3, 4]", "  t5-lr10: [2, 3, 4]"]
    grid.write_text(grid.read_text().rsplit("more_seeds:", 1)[0] + block + "\n")
    names = [r.name for r in load_grid(grid).plan()]
    assert names.count("rope_seed-4") == 1 and "t5-lr10_seed-2" in names and "t5-lr1_seed-2" not in names
