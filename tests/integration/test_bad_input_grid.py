"""Grid files that contradict themselves (configs/grid.py), refused by scripts/ablate.py before
anything trains, with the contradiction named: a value listed twice, an override an axis
overrules, two runs under one name, two runs that are one experiment. Each would train a
run twice or count it as two seeds; the fix the message gives is followed where it is one.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from helpers.bad_input import cli, refused, refused_in_process
from helpers.runs import write_grid, write_run_config
from ropelab.configs.grid import load_grid
from ropelab.grid import local as grid_local
from ropelab.scripts import ablate, tune
from ropelab.training.run_dir import RunDir
from ropelab.training.run_lock import EVALUATING, RunLock, live_holder


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
    assert "failed: seed-0: " in capsys.readouterr().out
    assert ablate.main([str(path), "--dry-run", "--no-estimate", "--set", "train.max_steps=12"]) == 0  # raised: continued
    assert "partial  step 8/12" in capsys.readouterr().out


# --------------------------------------------------------------- a probe cache that cannot be written

def test_a_probe_cache_that_cannot_be_written_names_its_variable_and_the_way_around_it(base, capsys, monkeypatch):
    """It said only "cannot read or write a file: …/probes: Not a directory", not which cache that
    is nor how to choose another or go without."""
    (base.parent / "file").write_text("a file\n")
    monkeypatch.setenv("ROPELAB_PROBE_CACHE", str(base.parent / "file" / "probes"))
    path = grid(base, "axes: {train.seed: [0, 1]}\n")
    err = refused_in_process(ablate.main, [str(path), "--dry-run"], capsys,
                             f"error: cannot keep the shape's timing in the probe cache ({base.parent / 'file' / 'probes'}",
                             "it is $ROPELAB_PROBE_CACHE", "skip the time estimate with --no-estimate")
    assert err.count("error:") == 1 and "Traceback" not in err
    assert ablate.main([str(path), "--dry-run", "--no-estimate"]) == 0  # the advice, followed


# --------------------------------------------------------------- an archive no record can go to

@pytest.mark.parametrize("where", ["archive", "archive/sub"])
def test_an_archive_that_is_not_a_directory_is_refused_before_anything_trains(base, capsys, where):
    """It was found after every run had trained and been evaluated: each failed to archive, exit 1,
    and no report was written."""
    (base.parent / "archive").write_text("a file\n")
    archive = base.parent / where
    path = grid(base, f"archive: {archive}\naxes: {{train.seed: [0, 1]}}\n")
    for argv in ([], ["--dry-run"]):
        refused_in_process(ablate.main, [str(path), "--no-estimate", *argv], capsys,
                           f"archive: {archive} must be a directory for the runs' records, but "
                           f"{base.parent / 'archive'} is a file")
    assert not (base.parent / "runs").exists()


# --------------------------------------------------------------- two grid commands at once

def two_seeds(base: Path) -> Path:
    """A grid of two seeds, 4 steps each, scored briefly at 16 and 32 tokens."""
    return grid(base, "overrides: [train.max_steps=4, train.eval_interval=4, train.ckpt_interval=4]\n"
                      f"axes: {{train.seed: [0, 1]}}\nreport: {base.parent / 'report'}\n"
                      "eval: {lengths: [16, 32], protocols: [nonoverlap], scalings: [none], max_tokens: 256}\n")


@pytest.mark.slow  # about 13 s on 2 quiet cores; CI runs it (-m slow)
def test_a_run_another_process_trains_is_running_elsewhere_not_failed(base, capsys):
    """With two ablate processes on one grid, the second listed the run the first was training
    as failed (train.py refused it: in use), exited 1 and reported it under "Missing runs"."""
    path = two_seeds(base)
    other = RunLock(RunDir(base.parent / "runs" / "g" / "seed-1")).acquire()  # as another process would hold it
    try:
        assert ablate.main([str(path), "--no-estimate"]) == 0
        out = capsys.readouterr().out
        assert "running elsewhere (1; another process trains or evaluates them, and not a failure)" in out
        assert f"seed-1: pid {os.getpid()} on" in out and "failed" not in out
        assert "reports not written: 1 run is not finished, 1 of them trained or evaluated by another process" in out
        assert not (base.parent / "report" / "report.md").exists()
    finally:
        other.release()
    assert ablate.main([str(path), "--no-estimate"]) == 0  # the other process's turn: it finishes the grid
    report = (base.parent / "report" / "report.md").read_text()
    assert "Missing runs" not in report and "Incomplete" not in report


def test_a_run_taken_between_the_check_and_its_start_is_running_elsewhere(base, capsys, monkeypatch):
    path = two_seeds(base)
    lock = RunLock(RunDir(base.parent / "runs" / "g" / "seed-0")).acquire()
    asked = []

    def late(run):  # the first look finds no holder: the other process took the run right after
        asked.append(run)
        return None if len(asked) == 1 else live_holder(run)
    monkeypatch.setattr(grid_local, "live_holder", late)
    try:
        assert ablate.main([str(path), "--no-estimate", "--rows", "seed-0"]) == 0
    finally:
        lock.release()
    out = capsys.readouterr().out
    assert "running elsewhere (1;" in out and "failed" not in out


def test_a_trained_run_another_grid_process_evaluates_is_left_to_it(base, capsys, monkeypatch):
    """A second ablate process found a trained run without its evaluations while the first was
    evaluating it (evaluations held no lock): it evaluated it too, and --status said "not evaluated"."""
    path = two_seeds(base)
    assert ablate.main([str(path), "--no-estimate", "--rows", "seed-0", "--skip-eval"]) == 0
    run = RunDir(base.parent / "runs" / "g" / "seed-0")
    other = RunLock(run, task=EVALUATING).acquire()  # as the other grid process holds it while it evaluates
    evaluated = []
    monkeypatch.setattr(grid_local, "eval_commands", lambda *a: evaluated.append(a) or [])
    try:
        capsys.readouterr()
        assert ablate.main([str(path), "--no-estimate", "--rows", "seed-0"]) == 0
        out = capsys.readouterr().out
        assert "running elsewhere (1; another process trains or evaluates them" in out
        assert f"seed-0: pid {os.getpid()} on" in out and "(evaluating)" in out and "failed" not in out
        assert "reports not written: 1 run is not finished, 1 of them trained or evaluated by another" in out
        assert not evaluated and not (base.parent / "report" / "report.md").exists()
        assert ablate.main([str(path), "--status"]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("seed-0 "))
        assert "running" in row and "(evaluating), step 4" in row
    finally:
        other.release()
    monkeypatch.undo()
    held = []
    real_call = grid_local._call
    monkeypatch.setattr(grid_local, "_call", lambda *a, **k: held.append(live_holder(run)) or real_call(*a, **k))
    assert ablate.main([str(path), "--no-estimate", "--rows", "seed-0"]) == 0  # its turn: evaluated, holding the lock
    assert held and all(h and h.startswith(f"pid {os.getpid()} on") and h.endswith("(evaluating)") for h in held)
    assert live_holder(run) is None and (base.parent / "report" / "report.md").exists()


@pytest.mark.slow  # about 15 s on 2 quiet cores; CI runs it (-m slow)
def test_a_report_written_while_runs_are_unfinished_says_how_to_finish_it(base, capsys):
    path = two_seeds(base)
    assert ablate.main([str(path), "--no-estimate", "--rows", "seed-0"]) == 0
    report = (base.parent / "report" / "report.md").read_text()
    assert "**Incomplete**: 1 run of this report had not finished" in report
    assert f"`ropelab ablate {path} --report` writes it again with them" in report
    assert report.index("**Incomplete**") < report.index("## Runs")
    assert ablate.main([str(path), "--no-estimate"]) == 0
    assert "Incomplete" not in (base.parent / "report" / "report.md").read_text()


# --------------------------------------------------------------- a SIGTERM to the grid's own process

def test_a_sigterm_to_ablate_stops_its_training_at_a_checkpoint(base, capsys, monkeypatch):
    """A SIGTERM to ropelab ablate ended it at once and left its train.py training on, orphaned."""
    path = grid(base, "overrides: [train.max_steps=100000, train.ckpt_interval=100000]\n"
                      "axes: {train.seed: [0, 1]}\n")
    started = []

    def term_once_training(proc, deadline):  # the grid's process is sent SIGTERM once its first run trains
        log = base.parent / "runs" / "g" / "seed-0" / "train.log"
        while not started and proc.poll() is None and not re.search(r"^step +\d+/", log.read_text(), re.M):
            time.sleep(0.1)
        if not started:
            started.append(proc)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_wait(proc, deadline)
    real_wait = grid_local.wait
    monkeypatch.setattr(grid_local, "wait", term_once_training)
    assert ablate.main([str(path), "--no-estimate"]) == 128 + signal.SIGTERM
    captured = capsys.readouterr()
    assert started[0].returncode == 128 + signal.SIGTERM  # stopped by the SIGTERM passed on, not left running
    assert f"run the same command again to continue (ropelab ablate {path})" in captured.err + captured.out
    assert "seed-1: not started: stopped by a SIGTERM to ropelab ablate" in captured.out
    assert "failed" not in captured.out
    assert ablate.main([str(path), "--dry-run", "--no-estimate"]) == 0
    assert re.search(r"seed-0 +partial +step \d+/100000", capsys.readouterr().out)  # its checkpoint, to continue
