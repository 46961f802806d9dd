"""ropelab device-session: a tiny grid in a one-minute budget, on the CPU, leaves its records
and a session.json in one folder, and refuses a grid without an archive before any work."""

from __future__ import annotations

import json

from helpers.runs import TINY_EVAL, write_grid
from ropelab.scripts import device_session


def test_a_minute_of_a_tiny_grid_comes_back_as_records(tmp_path, corpus, capsys):
    grid = write_grid(tmp_path, corpus, overrides=["train.max_steps=6", "train.eval_interval=6", "train.ckpt_interval=6"],
                      axes={"model.pos.kind": ["rope"]}, eval={**TINY_EVAL, "scalings": ["none"]},
                      report=tmp_path / "report", archive=tmp_path / "archive")
    out = tmp_path / "device-out"
    # A minute may not fit the run on a slow or busy machine: then it is left for later at its
    # checkpoint, and the next session (longer, so that no machine is too slow) finishes it.
    for budget in ("1m", "10m"):
        assert device_session.main([str(grid), "--budget", budget, "--out", str(out)]) == 0
        session = json.loads((out / "session.json").read_text())
        assert session["grid_exit_code"] == 0 and session["torch"] and "copy them into" in capsys.readouterr().out
        if session["records"]:
            break
    assert session["records"] == ["kind-rope"]
    assert (out / "records" / "tiny-grid" / "kind-rope" / "config.yaml").is_file()


def test_a_grid_without_an_archive_is_refused_before_any_work(tmp_path, corpus, capsys):
    grid = write_grid(tmp_path, corpus, axes={"model.pos.kind": ["rope"]}, report=tmp_path / "report")
    assert device_session.main([str(grid), "--budget", "1m", "--out", str(tmp_path / "o")]) == 2
    assert "has none; add an archive:" in capsys.readouterr().err and not (tmp_path / "runs").exists()
