"""Faults during and between trainings lose no work: damaged checkpoints, two trainers in
one run directory, kill -9, a full disk, leftovers of interrupted writes.

Each test asserts the exit code, the message, no traceback, and which files survive.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ropelab import train
import ropelab.training.checkpoint
from helpers.runs import write_run_config
from ropelab.training.checkpoint import read_meta
from ropelab.training.run_dir import RunDir
from ropelab.training.run_lock import RunLock
from helpers import ROOT


def steps(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if p.name != "latest")


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def test_a_damaged_newest_checkpoint_falls_back_to_the_intact_one(tmp_path, corpus, capsys):
    cfg = write_run_config(tmp_path, corpus)
    run = tmp_path / "runs" / "tiny"
    assert train.main([str(cfg), "train.max_steps=20"]) == 0
    truncate(run / "checkpoints" / "step_000020" / "model.safetensors")
    # What earlier advice led to: the pointer gone as well. Neither may restart from step 0.
    (run / "checkpoints" / "latest").unlink()
    capsys.readouterr()
    assert train.main([str(cfg), "train.max_steps=30", "train.keep_last=1", "--resume"]) == 0
    captured = capsys.readouterr()
    assert "truncated or corrupt" in captured.err and "falling back" in captured.err
    assert "resuming" in captured.out and "from step_000010" in captured.out
    # The damaged one is set aside, never loaded or pruned; the run continued from step 10.
    assert steps(run) == ["step_000030", "unreadable-step_000020"]
    assert read_meta(RunDir(run).latest_checkpoint())["step"] == 30


def test_no_readable_checkpoint_is_refused_with_advice_that_works(tmp_path, corpus):
    cfg = write_run_config(tmp_path, corpus)
    run = tmp_path / "runs" / "tiny"
    assert train.main([str(cfg), "train.max_steps=10"]) == 0
    truncate(run / "checkpoints" / "step_000010" / "state.pt")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "train.py", str(cfg), "train.max_steps=20", "--resume"], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "no checkpoint of" in res.stderr and f"mv {run} {run}.damaged" in res.stderr
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing was changed
    # The advice works: moved aside, the same command without --resume starts afresh.
    run.rename(f"{run}.damaged")
    assert train.main([str(cfg), "train.max_steps=10"]) == 0


def test_a_second_trainer_is_refused_while_the_first_holds_the_run(tmp_path, corpus, capsys):
    cfg = write_run_config(tmp_path, corpus)
    run = RunDir(tmp_path / "runs" / "tiny")
    assert train.main([str(cfg), "train.max_steps=10"]) == 0
    before = (run.path / "metrics.jsonl").read_text()
    with RunLock(run):  # another open file: flock refuses it as it would another process
        assert train.main([str(cfg), "train.max_steps=20", "--resume"]) == 2
        assert "is in use" in capsys.readouterr().err
    assert (run.path / "metrics.jsonl").read_text() == before
    assert train.main([str(cfg), "train.max_steps=20", "--resume"]) == 0  # released: it continues


@pytest.mark.slow
def test_a_second_trainer_is_refused_and_kill_9_leaves_no_stale_lock(tmp_path, corpus):
    cfg = write_run_config(tmp_path, corpus)
    run = tmp_path / "runs" / "tiny"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    steps = 1000  # a line per step: the first trainer blocks on its full stdout pipe long before its end
    command = [sys.executable, "train.py", str(cfg), f"train.max_steps={steps}", "train.ckpt_interval=5"]
    first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Its first checkpoint (step 5) is saved before it logs step 6: wait for that line, however
        # long it takes (pytest-timeout ends a hang), and never past the process's end.
        for line in first.stdout:
            logged = re.match(r"step +(\d+)/", line)
            if logged and int(logged.group(1)) >= 6:
                break
        else:
            pytest.fail(f"the first trainer ended (exit {first.wait()}) before its first checkpoint: "
                        f"{first.stderr.read()}")
        first.send_signal(signal.SIGSTOP)  # holding its lock, and the CPU free for the second
        assert (run / "checkpoints" / "latest").exists(), "step 6 logged, but no checkpoint of step 5"
        second = subprocess.run([*command, "--resume"], cwd=ROOT, env=env, capture_output=True, text=True)
        assert second.returncode == 2 and "Traceback" not in second.stderr, (second.returncode, second.stderr)
        assert "is in use" in second.stderr and f"pid {first.pid}" in second.stderr, second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
        first.stdout.close()
        first.stderr.close()
    # A write cut short by the kill, as a crash leaves it.
    leftover = run / "checkpoints" / ".step_000099.tmp-1-deadbeef"
    leftover.mkdir()
    assert read_meta(RunDir(run).latest_checkpoint())["step"] < steps
    end = steps  # the schedule it was planned for (fewer would be refused)
    res = subprocess.run([sys.executable, "train.py", str(cfg), "--resume", f"train.max_steps={end}",
                          "train.log_interval=5", "train.eval_interval=100"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert not leftover.exists()
    # Output to a pipe: one readable line per log_interval and per validation, no bar.
    assert f"step {end}/{end} | loss " in res.stdout and " tok/s" in res.stdout and "lr " in res.stdout
    assert f"validation at step {end}: val loss " in res.stdout and "| ppl " in res.stdout
    assert "\r" not in res.stdout + res.stderr


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(tmp_path, corpus, capsys, monkeypatch):
    cfg = write_run_config(tmp_path, corpus)
    run = tmp_path / "runs" / "tiny"
    real_save = ropelab.training.checkpoint.torch.save
    calls = []

    def fills_the_disk(obj, f):
        calls.append(1)
        if len(calls) < 2:
            return real_save(obj, f)
        f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ropelab.training.checkpoint.torch, "save", fills_the_disk)
    assert train.main([str(cfg), "train.max_steps=30"]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "continue with --resume" in err
    assert steps(run) == ["step_000010"]  # intact, and no half-written sibling
    assert not list(run.rglob("*.tmp-*"))
    monkeypatch.undo()
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "loss": 2.')  # a record a full disk cut short
    assert train.main([str(cfg), "train.max_steps=30", "train.log_interval=5", "--resume"]) == 0
    assert read_meta(RunDir(run).latest_checkpoint())["step"] == 30
    # Output that is not a terminal: one line per log_interval steps and per validation.
    out = capsys.readouterr().out
    assert "step 15/30 | loss " in out and "step 14/30" not in out and " tok/s" in out
    assert "validation at step 30: val loss " in out and "| ppl " in out
