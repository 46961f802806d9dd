"""``ropelab ablate GRID --status`` on a run in training: past its last checkpoint, the step its
training last logged, from the end of its metrics.jsonl (grid/status.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from ropelab.grid import status
from ropelab.training.metrics import last_step_record
from ropelab.training.run_dir import RunDir


def write_metrics(run: RunDir, entries: list[dict], tail: str = "") -> None:
    run.path.mkdir(parents=True, exist_ok=True)
    run.metrics.write_text("".join(json.dumps(e) + "\n" for e in entries) + tail)


def test_the_last_training_entry_is_read_from_the_end_of_a_long_file(tmp_path):
    run = RunDir(tmp_path / "r")
    entries = [{"step": s, "loss": 3.0, "tokens_per_sec": 3261.4, "time": 1000.0 + s} for s in range(10, 20001, 10)]
    # a validation entry after it, and a line being written: neither is the training's progress
    write_metrics(run, entries + [{"step": 20000, "val_loss": 2.9}], tail='{"step": 20010, "lo')
    assert last_step_record(run.metrics)["step"] == 20000
    assert status.live_progress(run, "partial", now=1000.0 + 20000 + 12) == "logged step 20000, 3,261 tok/s, 12 s ago"
    assert status.live_progress(run, "partial", now=1000.0 + 20000 + 3 * 3600) == "logged step 20000, 3,261 tok/s, 3.0 h ago"


def test_nothing_is_said_without_a_log_or_once_training_is_done(tmp_path):
    run = RunDir(tmp_path / "r")
    assert status.live_progress(run, "partial") == ""  # no metrics.jsonl yet
    write_metrics(run, [{"step": 0, "val_loss": 7.0}])  # evaluated at step 0, nothing trained yet
    assert status.live_progress(run, "partial") == ""
    write_metrics(run, [{"step": 4500, "loss": 2.1, "time": 5.0}])
    assert status.live_progress(run, "done") == ""


def test_a_run_held_by_a_live_process_shows_its_checkpoint_and_its_logged_step(tmp_path, monkeypatch):
    run_dir = RunDir(tmp_path / "runs" / "rope_seed-0")
    write_metrics(run_dir, [{"step": 2650, "loss": 2.9, "tokens_per_sec": 3400.0, "time": 100.0}])
    monkeypatch.setattr(status, "live_holder", lambda run: "pid 7 on vm, since 2026-12-07 19:48:08")
    monkeypatch.setattr(status.time, "time", lambda: 105.0)
    planned = SimpleNamespace(cfg=SimpleNamespace(out_dir=str(tmp_path / "runs"), name="rope_seed-0"))
    row = status.run_row(planned, "partial", "step 2600/4500", {}, {})
    assert (row.state, row.detail) == ("running", "by pid 7 on vm, since 2026-12-07 19:48:08, step 2600/4500, "
                                                  "logged step 2650, 3,400 tok/s, 5 s ago")
