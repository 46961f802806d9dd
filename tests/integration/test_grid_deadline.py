"""grid/deadline.py and ``ablate.py --until``: a grid stops taking runs at a deadline,
stops training under way there at a checkpoint, and leaves the rest for the same command."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ropelab.configs.grid import load_grid
from ropelab.scripts import ablate
from ropelab.grid import local as grid_local
from ropelab.grid.deadline import CompetencePlan, Deadline, needs_from, parse_deadline, plans_from, wait
from ropelab.grid.estimate import Estimate
from ropelab.grid.estimate_table import estimate_file, save_estimates, saved_estimates
from ropelab.grid.run_state import status

from helpers.runs import synthetic_grid

NOW = dt.datetime(2026, 12, 3, 9, 10, 30)


@pytest.mark.parametrize("text, expected", [
    ("90m", NOW + dt.timedelta(minutes=90)),
    ("2h", NOW + dt.timedelta(hours=2)),
    ("3h30m", NOW + dt.timedelta(hours=3, minutes=30)),
    ("09:25", dt.datetime(2026, 12, 3, 9, 25)),
    ("9:05", dt.datetime(2026, 12, 4, 9, 5)),  # passed today: tomorrow's
    ("2026-12-03T11:00", dt.datetime(2026, 12, 3, 11, 0)),
    ("2026-12-04 08:00", dt.datetime(2026, 12, 4, 8, 0)),
])
def test_deadline_forms(text, expected):
    assert parse_deadline(text, NOW) == expected


@pytest.mark.parametrize("text, message", [
    ("0h", "zero"), ("0m", "zero"), ("25:00", "not a time of day"), ("9:75", "not a time of day"),
    ("2026-12-03T09:00", "has passed"), ("soon", "expected a time of day"), ("", "expected a time of day"),
    ("1.5h", "expected a time of day"), ("-2h", "expected a time of day"),
])
def test_bad_deadlines_say_what_is_expected(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_deadline(text, NOW)


def test_a_bad_until_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        ablate.parse_args(["grid.yaml", "--until", "teatime"])
    assert e.value.code == 2 and "--until: expected a time of day" in capsys.readouterr().err


def test_a_deadline_past_the_calendar_is_a_usage_error(capsys):
    """--until 99999999h overflowed the date arithmetic: a traceback."""
    with pytest.raises(SystemExit) as e:
        ablate.parse_args(["grid.yaml", "--until", "99999999h"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "ends after the calendar does" in err and "Traceback" not in err


def test_a_negative_until_says_what_a_deadline_looks_like(capsys):
    """--until -5m was read by argparse as a flag: "expected one argument", no word of a deadline."""
    assert ablate.main(["grid.yaml", "--until", "-5m"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --until -5m: a deadline is ahead of now, as a time of day (09:25)") and \
        err.count("\n") == 1


def test_a_run_starts_only_if_its_estimate_ends_by_the_deadline():
    deadline = Deadline(at=1000.0, needs={"long": 600.0, "short": 300.0})
    assert deadline.refusal("short", now=600.0) is None
    assert deadline.refusal("long", now=600.0) == "needs about 10 min by its estimate, 7 min left"
    assert deadline.refusal("unestimated", now=999.0) is None  # no estimate: it may start, and is stopped then
    assert deadline.refusal("short", now=1000.0) == "the deadline has passed"


def test_needs_prefer_this_invocations_estimates_and_a_rows_expected_time():
    saved = {"a": {"train_s": 100.0, "eval_s": 5.0}, "b": {"train_s": 100.0, "eval_s": 5.0}, "junk": 3}
    estimates = {"b": Estimate(200.0, 10.0, expected_train_s=50.0), "c": Estimate(70.0, 1.0),
                 "a": Estimate(0.0, 0.0, "no estimate: its data is missing", failed=True)}
    assert needs_from(estimates, saved) == {"b": 60.0, "c": 71.0}


def test_a_rows_ended_run_renews_its_row_mates_expectation():
    """A seed planned at its whole budget (no run of its row had ended) is expected, once one
    has, to train as many steps as the row's ended runs did past its own progress, in proportion
    to its budget's seconds; other rows, and a resumed run already past those steps, keep theirs."""
    plans = {"a_seed-1": CompetencePlan("a", 0, 16_000, 8_000.0, 60.0),
             "a_seed-2": CompetencePlan("a", 9_000, 7_000, 3_500.0, 60.0),  # resumed at step 9,000
             "b_seed-1": CompetencePlan("b", 0, 16_000, 8_000.0, 60.0)}
    deadline = Deadline(at=6_000.0, needs={name: p.train_s + p.eval_s for name, p in plans.items()}, plans=plans)
    assert deadline.refusal("a_seed-1", now=0.0) == "needs about 2 h 14 min by its estimate, 1 h 40 min left"
    assert deadline.run_ended("a", 8_000) == ["a_seed-1"]  # a_seed-2 is past step 8,000: no expectation
    assert deadline.needs["a_seed-1"] == 8_000.0 * 0.5 + 60.0 and deadline.refusal("a_seed-1", now=0.0) is None
    assert deadline.needs["a_seed-2"] == 3_560.0 and deadline.needs["b_seed-1"] == 8_060.0
    assert deadline.run_ended("a", 12_000) == ["a_seed-1", "a_seed-2"]
    assert deadline.needs["a_seed-1"] == 8_000.0 * (10_000 / 16_000) + 60.0  # the mean of 8,000 and 12,000
    assert deadline.needs["a_seed-2"] == 3_500.0 * (3_000 / 7_000) + 60.0  # only the run past step 9,000
    assert deadline.ended == {"a": [8_000, 12_000]}


def test_plans_are_the_estimated_runs_that_stop_at_competence():
    estimates = {"a_seed-1": Estimate(100.0, 5.0, competence_row="a", done=10, steps=90),
                 "b_seed-0": Estimate(70.0, 1.0),
                 "c_seed-0": Estimate(0.0, 0.0, "no estimate: x", failed=True, competence_row="c")}
    assert plans_from(estimates) == {"a_seed-1": CompetencePlan("a", 10, 90, 100.0, 5.0)}


def test_a_worker_starts_a_seed_its_row_mate_made_short_enough(tmp_path, monkeypatch):
    """One slot, a deadline 100 min away, two seeds of a row whose budget takes 150 min: the
    first starts (no estimate refused it: it may start, and would be stopped at the deadline),
    ends at a third of its budget, and the second is then expected to take 50 min and starts,
    where the whole-budget estimate would have left it for later."""
    grid = load_grid(synthetic_grid(tmp_path))
    runs = [SimpleNamespace(name=f"r_seed-{seed}") for seed in (0, 1)]
    trained = []
    monkeypatch.setattr(grid_local, "status", lambda run: ("new", ""))
    monkeypatch.setattr(grid_local, "run_one", lambda grid, run, *a: trained.append(run.name) or (True, ""))
    monkeypatch.setattr(grid_local, "ended_at", lambda grid, run: 3_000)
    plan = CompetencePlan("r", 0, 9_000, 9_000.0, 0.0)
    for renewed in (True, False):
        trained.clear()
        deadline = Deadline(at=time.time() + 6_000, needs={"r_seed-1": 9_000.0}, plans={"r_seed-1": plan})
        if not renewed:  # as before renewal: the plan is unknown, so the whole budget stands
            deadline.plans.clear()
        left: dict[str, str] = {}
        assert grid_local.run_all(grid, runs, [grid_local.Slot()], evaluate=False, deadline=deadline, left=left) == {}
        assert trained == (["r_seed-0", "r_seed-1"] if renewed else ["r_seed-0"])
        assert list(left) == ([] if renewed else ["r_seed-1"])


def test_a_failed_estimate_is_not_saved_over_an_earlier_one(tmp_path):
    """A run whose estimate failed this time keeps the seconds an earlier invocation saved, so a
    later --until does not read 0 s for it."""
    grid = SimpleNamespace(out_dir=str(tmp_path), name="g")
    save_estimates(grid, {"a": Estimate(100.0, 5.0), "b": Estimate(0.0, 0.0, "no estimate: x", failed=True)})
    assert saved_estimates(grid) == {"a": {"train_s": 100.0, "eval_s": 5.0}}
    save_estimates(grid, {"a": Estimate(0.0, 0.0, "no estimate: its data is missing", failed=True),
                          "b": Estimate(7.0, 1.0)})
    assert saved_estimates(grid) == {"a": {"train_s": 100.0, "eval_s": 5.0}, "b": {"train_s": 7.0, "eval_s": 1.0}}


def sigterm_child(tmp: Path) -> subprocess.Popen:
    """A process that, on SIGTERM, writes ``saved`` and exits 143, as train.py saves its
    checkpoint. It says ``ready`` on its stdout once it handles the signal, and this waits for
    that line however long the interpreter takes to start (pytest-timeout ends a hang)."""
    script = ("import signal, sys, pathlib\n"
              f"d = pathlib.Path({str(tmp)!r})\n"
              "def stop(*_):\n    (d / 'saved').write_text('1'); sys.exit(143)\n"
              "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\n"
              "while True:\n    signal.pause()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line != "ready\n":
        proc.kill()
        pytest.fail(f"the child process ended before it handled SIGTERM (exit {proc.wait()}): {proc.stderr.read()}")
    return proc


def test_the_deadline_stops_a_process_with_sigterm(tmp_path):
    with sigterm_child(tmp_path) as proc:
        assert wait(proc, time.time() - 1) == (143, True)
        assert (tmp_path / "saved").is_file(), f"exit 143 without the SIGTERM handler's file: {proc.stderr.read()}"
    assert (tmp_path / "saved").read_text() == "1"
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert wait(done, None) == (3, False)


@pytest.mark.slow  # about 15 s on 2 quiet cores; CI runs it (-m slow)
def test_until_leaves_runs_the_estimate_says_cannot_finish(tmp_path, capsys):
    """A run whose saved estimate ends after the deadline is not started: not a failure, no
    report yet, and the same command without --until trains it."""
    grid_path = synthetic_grid(tmp_path)
    grid = load_grid(grid_path)
    path = estimate_file(grid)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"kind-rope": {"train_s": 7200.0, "eval_s": 60.0},
                                "kind-learned": {"train_s": 30.0, "eval_s": 5.0}}))
    assert ablate.main([str(grid_path), "--no-estimate", "--until", "1h"]) == 0
    out = capsys.readouterr().out
    runs = {run.name: run for run in grid.plan()}
    assert status(runs["kind-rope"])[0] == "new" and status(runs["kind-learned"])[0] == "done"
    assert "kind-rope: not started: needs about 2 h 1 min by its estimate" in out
    assert "reports not written: 1 run was left for later" in out
    assert "left for later (1; the same command continues them)" in out and "failed" not in out
    assert not (tmp_path / "report").exists()
    assert ablate.main([str(grid_path), "--no-estimate"]) == 0
    assert all(status(run)[0] == "done" for run in runs.values())
    assert (tmp_path / "report" / "tasks" / "report.md").is_file()


class StartsThenEnds(Deadline):
    """A deadline that lets every run start and has passed by the time it trains: whatever
    the machine's speed, the run is stopped at once."""

    def refusal(self, name, now=None):
        return None


def test_training_under_way_at_the_deadline_is_stopped_and_continued_later(tmp_path, capsys, caplog):
    grid = load_grid(synthetic_grid(tmp_path))
    runs = grid.plan()
    left: dict[str, str] = {}
    caplog.set_level(logging.INFO, logger="ropelab")
    failures = grid_local.run_all(grid, runs[:1], [grid_local.Slot()], evaluate=True,
                                  deadline=StartsThenEnds(at=time.time() - 1, needs={}), left=left)
    assert failures == {} and left == {runs[0].name: "stopped at the deadline (at its checkpoint)"}
    assert status(runs[0])[0] in ("new", "partial")  # a checkpoint if train.py had set its handler by then
    assert "stopped at the deadline, its checkpoint saved" in caplog.text
    assert grid_local.run_all(grid, runs[:1], [grid_local.Slot()], evaluate=True) == {}
    assert status(runs[0])[0] == "done"


def test_training_stopped_by_hand_is_left_for_later_not_failed(tmp_path, monkeypatch, caplog):
    """A SIGTERM sent to a run's train.py (which saves a checkpoint and exits 128 + SIGTERM)
    leaves the run for the same command to continue; an evaluation ending so, or a training
    ending with another code, is still a failure."""
    grid = load_grid(synthetic_grid(tmp_path))
    runs = grid.plan()[:1]
    exits = {"train": 143}

    def command(code):
        return [sys.executable, "-c", f"print('stopped by SIGTERM at step 7; checkpoint saved'); raise SystemExit({code})"]
    monkeypatch.setattr(grid_local, "train_command", lambda grid, run, device: command(exits["train"]))
    left: dict[str, str] = {}
    caplog.set_level(logging.INFO, logger="ropelab")
    assert grid_local.run_all(grid, runs, [grid_local.Slot()], evaluate=False, left=left) == {}
    assert left == {runs[0].name: "stopped by SIGTERM from outside the grid (at its checkpoint)"}
    assert "its checkpoint saved; the same command continues it" in caplog.text
    exits["train"] = 1
    failures = grid_local.run_all(grid, runs, [grid_local.Slot()], evaluate=False, left={})
    assert failures[runs[0].name].startswith("exit 1: stopped by SIGTERM at step 7")
    monkeypatch.setattr(grid_local, "evaluation_cached", lambda run: False)
    monkeypatch.setattr(grid_local, "eval_commands", lambda run, device: [command(143)])
    ok, reason = grid_local.evaluate_one(runs[0], grid_local.Slot())  # an evaluation is not resumable
    assert not ok and reason.startswith("exit 143: stopped by SIGTERM at step 7")


def test_until_is_refused_for_slurm(tmp_path, capsys):
    assert ablate.main([str(synthetic_grid(tmp_path)), "--launcher", "slurm", "--until", "2h"]) == 2
    assert "--until stops runs trained here; on Slurm each job ends at its time limit" in capsys.readouterr().err
