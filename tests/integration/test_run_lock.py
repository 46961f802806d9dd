"""training/run_lock.py across hosts: the holder it records, when a leftover holder is taken
over and when it is not; training/slurm.py's job states (squeue and sacct are faked)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from ropelab.common.errors import RunInUseError
from helpers.fake_slurm import FakeSlurm
from ropelab.training.run_dir import RunDir
from ropelab.training.run_lock import EVALUATING, Holder, RunLock, live_holder
from ropelab.training.slurm import JobState, current_job, job_states


@pytest.fixture
def run(tmp_path, monkeypatch) -> RunDir:
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    (run.path / "config.yaml").write_text("name: run\n")  # a run with files: its lock file stays
    return run


def leave_holder(run: RunDir, **holder) -> None:
    """A lock file as a holder that never released it leaves it (killed, or its host lost)."""
    run.lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": "then", **holder}))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_holder_is_recorded_and_cleared(run, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "120")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")
    with RunLock(run):
        holder = json.loads(run.lock.read_text())
        assert (holder["pid"], holder["host"], holder["slurm_job"]) == (os.getpid(), socket.gethostname(), "120_4")
        assert "Slurm job 120_4" in live_holder(run)
        with pytest.raises(RunInUseError, match=f"pid {os.getpid()} on {socket.gethostname()}, Slurm job 120_4"):
            RunLock(run).acquire()
    assert run.lock.read_text() == "" and live_holder(run) is None


def test_holder_gone_from_this_host_is_taken_over(run, caplog):
    leave_holder(run, pid=dead_pid())
    with RunLock(run):
        assert json.loads(run.lock.read_text())["pid"] == os.getpid()
    assert "which is gone (pid" in (err := caplog.text) and "has exited); taking it over" in err


def test_live_holder_is_kept_even_without_its_flock(run):
    leave_holder(run)  # this process: alive, on this host
    with pytest.raises(RunInUseError, match="is in use"):
        RunLock(run).acquire()
    assert live_holder(run).startswith(f"pid {os.getpid()}")


@pytest.mark.parametrize("state, taken", [("RUNNING", False), ("PENDING", False), ("FAILED", True), (None, True)])
def test_holder_on_another_host_is_checked_with_slurm(run, tmp_path, monkeypatch, caplog, state, taken):
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.set_states({"77": state} if state else {})
    leave_holder(run, host="node-17", slurm_job="77")
    if taken:
        with RunLock(run):
            pass
        why = f"Slurm job 77 is {state or 'no longer known'}"
        assert f"held by pid {os.getpid()} on node-17, Slurm job 77, since then, which is gone ({why})" in \
            caplog.text
    else:
        with pytest.raises(RunInUseError, match="node-17, Slurm job 77"):
            RunLock(run).acquire()


def test_holder_that_cannot_be_checked_is_kept(run, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue: the other host's job cannot be asked about
    leave_holder(run, host="node-17", slurm_job="77")
    with pytest.raises(RunInUseError, match=f"delete {run.lock}"):
        RunLock(run).acquire()
    leave_holder(run, host="workstation")
    with pytest.raises(RunInUseError):
        RunLock(run).acquire()


def test_requeued_job_takes_over_its_own_lock(run, tmp_path, monkeypatch, caplog):
    FakeSlurm(tmp_path, monkeypatch).set_states({"77": "RUNNING"})  # Slurm: it runs (again)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    leave_holder(run, host="node-17", slurm_job="77")
    with RunLock(run):
        pass
    assert "this is the same Slurm job 77, restarted" in caplog.text


def test_lock_of_the_flock_only_format_is_taken_silently(run, capsys):
    run.lock.write_text(f"pid 1 on {socket.gethostname()} (since 2026-01-01 00:00:00)\n")
    with RunLock(run):
        pass
    assert capsys.readouterr().err == ""


def test_job_states_from_squeue_then_sacct(tmp_path, monkeypatch):
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.set_states({"5_0": "RUNNING", "5_1": "PENDING Dependency"}, sacct={"3": "CANCELLED by 0"})
    states = job_states(["5_0", "5_1", "3", "2"])
    assert states == {"5_0": JobState("RUNNING"), "5_1": JobState("PENDING", "Dependency"), "3": JobState("CANCELLED")}
    assert {job: s.live for job, s in states.items()} == {"5_0": True, "5_1": True, "3": False}
    assert job_states(["2"]) == {}  # squeue's error for one forgotten id, no accounting
    monkeypatch.setenv("PATH", str(tmp_path))
    assert job_states(["5_0"]) is None and job_states([]) == {}
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    assert current_job() == "9"


def test_a_grid_evaluating_a_run_is_named_as_such_and_keeps_training_out(run):
    with RunLock(run, task=EVALUATING):
        assert json.loads(run.lock.read_text())["task"] == "evaluating"
        assert live_holder(run).endswith("(evaluating)")
        with pytest.raises(RunInUseError, match=r"\(evaluating\) is training or evaluating it"):
            RunLock(run).acquire()
    assert live_holder(run) is None
    old = Holder.parse(json.dumps({"pid": 1, "host": "h", "since": "then"}))  # written before holders had a task
    assert old.task == "training" and str(old) == "pid 1 on h, since then"
