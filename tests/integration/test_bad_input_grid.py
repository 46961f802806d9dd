"""Grid files that contradict themselves (configs/grid.py), refused by scripts/ablate.py before
anything trains, with the contradiction named: a value listed twice, an override an axis
overrules, two runs under one name, two runs that are one experiment. Each would train a
run twice or count it as two seeds; the fix the message gives is followed where it is one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.bad_input import cli, refused, refused_in_process
from helpers.runs import write_grid, write_run_config
from ropelab.configs.grid import load_grid
from ropelab.scripts import ablate, tune


@pytest.fixture
def base(tmp_path, corpus) -> Path:
    return write_run_config(tmp_path, corpus)


def grid(base: Path, body: str) -> Path:
    return write_grid(base.parent, name="g", base=base, file="grid", text=body)

def test_an_axis_that_lists_a_seed_twice(base):
    res = cli("scripts/ablate.py", str(grid(base, "axes: {train.seed: [0, 0]}\n")), "--dry-run")
    refused(res, "the axis train.seed lists 0 twice", "count it as two seeds")
    assert not (base.parent / "runs").exists()


@pytest.mark.parametrize("body, fragment", [
    ("axes: {model.pos.kind: [rope, alibi, rope]}\n", "the axis model.pos.kind lists rope twice"),
    ('axes: {train.seed: [1, "1"]}\n', "the axis train.seed lists 1 twice"),
    ("axes: {eval.lengths: [[32, 64], [32, 64]]}\n", "lists [32, 64] twice"),
    ("axes: {train.lr: [1, 1.0]}\n", "runs lr-1 and lr-1.0 would train the same experiment: train.lr=1 and "
                                     "train.lr=1.0 come to the same config"),
    ("variants:\n  a: [model.pos.kind=alibi, 'eval.scalings=[none]']\n  b: [model.pos.kind=alibi]\n",
     "runs a and b would train the same experiment: they differ only in eval.scalings, which do not change "
     "what is trained"),
    ("variants:\n  a: [model.pos.kind=alibi]\naxes: {model.pos.kind: [rope]}\n",
     "variant a sets model.pos.kind=alibi, but the axis model.pos.kind sets it for every run"),
    ("overrides: [train.seed=3]\naxes: {train.seed: [0, 1]}\n", "overrides sets train.seed=3, but the axis train.seed"),
    ("axes: {data.local.valid: [/a/b/c, /a_b/c]}\n", "two runs get the name valid-a_b_c"),
    (f"axes: {{name_part: [{'x' * 41}, {'y' + 'x' * 40}]}}\n".replace("name_part", "log.wandb_project"),
     "two runs get the name wandb_project-" + "x" * 40),
    ("variants:\n  a: [model.pos.kind=alibi]\n  a: [model.pos.kind=t5]\n", "the key 'a' is written twice"),
    ("axes:\n  train.seed: [0]\n  train.seed: [1]\n", "the key 'train.seed' is written twice"),
], ids=["repeated-kind", "int-and-string", "repeated-list", "1-and-1.0", "variants-differ-in-eval-only",
        "variant-overruled-by-axis", "override-overruled-by-axis", "names-collide", "names-truncated-alike",
        "variant-named-twice", "axis-named-twice"])
def test_a_grid_that_contradicts_itself(base, capsys, body, fragment):
    refused_in_process(ablate.main, [str(grid(base, body)), "--dry-run"], capsys, fragment)
    assert not (base.parent / "runs").exists()


def test_a_set_override_that_an_axis_overrules(base, capsys):
    path = grid(base, "axes: {train.seed: [0, 1]}\n")
    refused_in_process(ablate.main, [str(path), "--dry-run", "--set", "train.seed=5"], capsys,
                       "--set sets train.seed=5, but the axis train.seed sets it for every run")
    assert ablate.main([str(path), "--dry-run", "--no-estimate", "--set", "train.lr=5e-3"]) == 0  # any other key


def test_removing_what_the_message_names_makes_the_grid_plan(base):
    """The advice "remove it" works: without the repeat, the grid plans its distinct runs."""
    assert [run.name for run in load_grid(grid(base, "axes: {train.seed: [0, 2]}\n")).plan()] == ["seed-0", "seed-2"]


def test_changing_a_value_whose_name_collides_makes_the_grid_plan(base):
    """The advice "change one" for two values that give one run name."""
    runs = load_grid(grid(base, "axes: {data.local.valid: [/a/b/c, /d/c]}\n")).plan()
    assert [run.name for run in runs] == ["valid-a_b_c", "valid-d_c"]


# --------------------------------------------------------------- an output path that holds something else

def test_tune_refuses_a_run_directory_as_its_out(base, capsys):
    """It wrote tuning.md and tuning.json into whatever --out named, a run's directory included."""
    run = base.parent / "runs" / "tiny"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(base.read_text())
    path = grid(base, "axes: {train.seed: [0, 1]}\n")
    refused_in_process(tune.main, [str(path), "--out", str(run)], capsys, f"--out {run} is a run directory",
                       "`ropelab tune` writes into a directory of its own")
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]
    (base.parent / "tasks").mkdir()
    (base.parent / "tasks" / "results.json").write_text('{"runs": [], "results": [], "kmax": []}')
    refused_in_process(tune.main, [str(path), "--out", str(base.parent / "tasks")], capsys,
                       "holds a task report, written by `ropelab tasks`", "`ropelab tune` writes beside only a "
                       "perplexity report")


# --------------------------------------------------------------- runs on disk that disagree with the grid

@pytest.mark.parametrize("lowered, key", [
    (["train.max_steps=4"], "train.max_steps: it trained 8 steps, the row's budget is 4"),
    (["train.max_steps=null", "train.max_tokens=1024"], "train.max_tokens: it trained 2,048 tokens, the row's "
                                                          "budget is 1,024"),
], ids=["steps", "tokens"])
def test_a_run_trained_past_a_lowered_budget_is_a_conflict(base, capsys, lowered, key):
    """A grid whose budget was lowered reported its runs trained past it under the new budget,
    pooled with seeds trained to it, without a word."""
    path = grid(base, "overrides: [train.max_steps=8, train.eval_interval=8, train.ckpt_interval=8]\n"
                      "axes: {train.seed: [0]}\n")
    assert ablate.main([str(path), "--skip-eval", "--no-estimate"]) == 0
    capsys.readouterr()
    assert ablate.main([str(path), "--dry-run", "--no-estimate", "--set", *lowered]) == 0
    out = capsys.readouterr().out
    assert "seed-0" in out and "conflict" in out and key in out, out
    assert ablate.main([str(path), "--skip-eval", "--no-estimate", "--set", *lowered]) == 1
    assert f"failed: seed-0: " in capsys.readouterr().out
    assert ablate.main([str(path), "--dry-run", "--no-estimate", "--set", "train.max_steps=12"]) == 0  # raised: continued
    assert "partial  step 8/12" in capsys.readouterr().out
