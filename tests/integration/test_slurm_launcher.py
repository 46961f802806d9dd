"""scripts/ablate.py --launcher slurm: resources, job scripts, resubmission, status, cancel,
bad input; the job side (grid/slurm_job.py) under submitit's local executor.

Slurm itself is faked (tests/helpers/fake_slurm.py); tests/integration/test_slurm_cluster.py runs a grid on a
real one.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

submitit = pytest.importorskip("submitit")

from ropelab.common.errors import ConfigError
from ropelab.configs.grid import load_grid
from helpers.runs import write_grid
from helpers.fake_slurm import FakeSlurm
from ropelab.scripts import ablate
from ropelab.grid import runner, slurm_launcher
from ropelab.grid.jobs import train_command
from ropelab.grid.status import print_status
from ropelab.grid.slurm_job import RunJob, torchrun
from ropelab.training.run_dir import RunDir

SLURM = "slurm: {partition: gpu, gpus_per_run: 2, cpus_per_run: 8, mem: 32G, time: 90, eval_time: \"0:30:00\"}"


def slurm_grid(tmp: Path, corpus: Path, slurm: str = SLURM, kinds: str = "[rope, alibi, none]") -> Path:
    return write_grid(tmp, corpus, name="g", file="grid",
                      overrides=["train.max_steps=12", "train.eval_interval=12", "train.ckpt_interval=4"],
                      axes=f"{{model.pos.kind: {kinds}}}",
                      eval={"lengths": [16, 32], "protocols": ["nonoverlap"], "scalings": ["none"], "max_tokens": 512},
                      report=tmp / "report", text=f"{slurm}\n")

def submitted_job(grid_file: Path, job: str) -> RunJob:
    """The RunJob submitit pickled for ``job`` (e.g. 1_0), as the cluster would run it."""
    folder = load_grid(grid_file).runs_dir / "_slurm" / "logs" / job
    return submitit.core.utils.DelayedSubmission.load(folder / f"{job}_submitted.pkl").function


def test_slurm_section_is_checked_and_overridden(tmp_path, corpus):
    grid = load_grid(slurm_grid(tmp_path, corpus))
    res = slurm_launcher.resources(grid, ["time=4:00:00", "sbatch.qos=high", "partition=debug"])
    assert (res.partition, res.gpus_per_run, res.gpus_per_node, res.time, res.sbatch) == ("debug", 2, 2, "4:00:00",
                                                                                          {"qos": "high"})
    with pytest.raises(ConfigError, match="did you mean 'slurm.gpus_per_run'"):
        load_grid(slurm_grid(tmp_path, corpus, "slurm: {gpu_per_run: 1, time: 5}"))
    with pytest.raises(ConfigError, match="not a time limit"):
        slurm_launcher.resources(grid, ["time=soon"])
    with pytest.raises(ConfigError, match="split evenly"):
        slurm_launcher.resources(grid, ["nodes=3"])
    with pytest.raises(ConfigError, match="add gpus_per_run, time to a slurm: section"):
        slurm_launcher.resources(load_grid(slurm_grid(tmp_path, corpus, "")), [])


def test_submission_writes_arrays_with_resources_and_dependency(tmp_path, corpus, monkeypatch, capsys):
    slurm = FakeSlurm(tmp_path, monkeypatch)
    grid = slurm_grid(tmp_path, corpus)
    assert ablate.main([str(grid), "--launcher", "slurm", "--slurm", "sbatch.qos=high"]) == 0
    train, evaluation = slurm.scripts()
    for option in ("--array=0-2%3", "--partition=gpu", "--time=90", "--gpus-per-node=2", "--cpus-per-task=8",
                   "--mem=32G", "--qos=high", "--signal=USR2@90", "--job-name=g-train"):
        assert f"#SBATCH {option}\n" in train, option
    for option in ("--array=0-2%3", "--time=30", "--gpus-per-node=1", "--dependency=aftercorr:1",
                   "--kill-on-invalid-dep=yes", "--job-name=g-eval"):
        assert f"#SBATCH {option}\n" in evaluation, option
    assert "--dependency" not in train
    record = json.loads((tmp_path / "runs" / "g" / "_slurm" / "jobs.json").read_text())
    assert record["kind-alibi"] == {"train": "1_1", "eval": "2_1"}
    job = submitted_job(grid, "1_1")  # what the cluster runs: the local command, under torchrun for 2 GPUs
    assert job.commands == [train_command(load_grid(grid), load_grid(grid).plan()[1])]
    assert (job.procs_per_node, job.nodes, job.threads, job.cwd) == (2, 1, 4, str(Path.cwd()))
    assert job.log == str(tmp_path / "runs" / "g" / "kind-alibi" / "train.log")
    ev = submitted_job(grid, "2_1")
    assert ev.commands[0][2:4] == ["ropelab.eval.lm.extrapolation", str(tmp_path / "runs" / "g" / "kind-alibi")]
    assert ev.procs_per_node == 1 and list(ev.files) == [str(RunDir(tmp_path / "runs/g/kind-alibi").planned_eval)]
    assert not (tmp_path / "runs" / "g" / "kind-alibi").exists()  # nothing in the runs until a job starts
    assert "--status" in capsys.readouterr().out


def test_torchrun_wraps_the_same_command():
    cmd = [sys.executable, "-m", "ropelab.train", "c.yaml", "name=x"]
    assert torchrun(cmd, 4, 1, {}) == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                       "--nproc_per_node=4", "-m", "ropelab.train", "c.yaml", "name=x"]


def test_resubmission_skips_running_finished_and_held_runs(tmp_path, corpus, monkeypatch, caplog):
    slurm = FakeSlurm(tmp_path, monkeypatch)
    grid_file = slurm_grid(tmp_path, corpus, kinds="[rope, alibi, none, sinusoidal, learned]")
    grid = load_grid(grid_file)
    runs = grid.plan()
    res = slurm_launcher.resources(grid, [])
    new = {run.name: ("new", "") for run in runs}
    slurm_launcher.submit_grid(grid, runs, new, res, evaluate=True)
    # rope runs, alibi failed, none was cancelled, sinusoidal finished (not evaluated), learned
    # is trained by hand on this machine (its lock names this live process).
    slurm.set_states({"1_0": "RUNNING", "1_1": "FAILED", "2_0": "PENDING Dependency", "2_1": "CANCELLED"},
                     sacct={"1_2": "CANCELLED by 0"})
    lock = RunDir.of(runs[4].cfg).lock
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": "now"}))
    states = {**new, "kind-alibi": ("partial", "step 4/12"), "kind-sinusoidal": ("done", "step 12")}
    caplog.set_level(logging.INFO, logger="ropelab")
    slurm_launcher.submit_grid(grid, runs, states, res, evaluate=True)
    out = caplog.text
    assert "kind-rope" in out and "not submitted: job 1_0 is running" in out
    assert "kind-learned" in out and "in use by pid" in out
    scripts = slurm.scripts()
    assert len(scripts) == 5 and "--array=0-1%2" in scripts[2] and "--dependency=aftercorr:3" in scripts[3]
    assert "--array" not in scripts[4] and "--dependency" not in scripts[4]  # sinusoidal's evaluation alone
    record = json.loads((grid.runs_dir / "_slurm" / "jobs.json").read_text())
    assert record["kind-rope"] == {"train": "1_0", "eval": "2_0"}
    assert record["kind-alibi"] == {"train": "3_0", "eval": "4_0"} and record["kind-none"]["train"] == "3_1"
    assert record["kind-sinusoidal"] == {"train": "1_3", "eval": "5"}
    assert submitted_job(grid_file, "3_0").commands[0][-2:] == ["train.resume=auto", "log.progress=false"]


def test_sbatch_refusal_is_one_line_and_records_nothing(tmp_path, corpus, monkeypatch, capsys):
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.refuse("sbatch: error: invalid partition specified: nope\n"
                 "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    grid = slurm_grid(tmp_path, corpus)
    monkeypatch.setattr(runner, "git_commit", lambda: "c" * 40)  # a clean tree: no warning beside the error
    assert ablate.main([str(grid), "--launcher", "slurm", "--slurm", "partition=nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: sbatch refused the training jobs of 3 runs: invalid "
                                                   "partition specified: nope; Batch job submission failed")
    assert not (tmp_path / "runs" / "g" / "_slurm" / "jobs.json").exists()


def test_slurm_unusable_is_a_clear_error(tmp_path, corpus, monkeypatch, capsys):
    grid = slurm_grid(tmp_path, corpus)
    FakeSlurm(tmp_path, monkeypatch, commands=())
    monkeypatch.setenv("PATH", str(tmp_path / "fake-slurm"))  # no sbatch anywhere
    assert ablate.main([str(grid), "--launcher", "slurm"]) == 2
    assert "sbatch, which is not on PATH" in capsys.readouterr().err
    FakeSlurm(tmp_path, monkeypatch)
    monkeypatch.setattr(slurm_launcher, "submitit", None)
    assert ablate.main([str(grid), "--launcher", "slurm"]) == 2
    assert "pip install 'ropelab[slurm]'" in capsys.readouterr().err
    monkeypatch.undo()
    (tmp_path / "no-srun").mkdir()
    FakeSlurm(tmp_path / "no-srun", monkeypatch, commands=("sbatch", "squeue", "sacct", "scancel"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-srun" / "fake-slurm"))  # sbatch, but no srun (submitit's traceback)
    assert ablate.main([str(grid), "--launcher", "slurm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --launcher slurm needs Slurm's srun beside sbatch") and "Traceback" not in err
    assert not (tmp_path / "no-srun" / "fake-slurm" / "sbatch-1.sh").exists()
    monkeypatch.undo()
    FakeSlurm(tmp_path, monkeypatch)
    assert ablate.main([str(slurm_grid(tmp_path, corpus, "slurm: {cpus_per_run: 4}")), "--launcher", "slurm"]) == 2
    err = capsys.readouterr().err
    assert "add gpus_per_run, time to its slurm: section" in err and "--slurm gpus_per_run=... time=..." in err
    assert not (tmp_path / "fake-slurm" / "sbatch-1.sh").exists()


def test_status_table_and_cancel(tmp_path, corpus, monkeypatch, capsys):
    slurm = FakeSlurm(tmp_path, monkeypatch)
    grid_file = slurm_grid(tmp_path, corpus, kinds="[rope, alibi, none, sinusoidal]")
    assert ablate.main([str(grid_file), "--launcher", "slurm", "--skip-eval"]) == 0
    grid = load_grid(grid_file)
    runs = grid.plan()
    log = RunDir.of(runs[2].cfg).log
    log.parent.mkdir(parents=True)
    log.write_text("$ python -m train\nstep 1/12 | loss 5.1\nerror: the loss became nan at step 2\n")
    slurm.set_states({"1_0": "RUNNING", "1_1": "PENDING Priority", "1_2": "FAILED"})
    capsys.readouterr()
    states = {run.name: ("new", "") for run in runs}
    states["kind-rope"] = ("partial", "step 4/12")
    assert print_status(grid, runs, states) == 0
    rows = {line.split()[0]: line.split(maxsplit=3)[1:] for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["kind-rope"] == ["running", "1_0", "training step 4/12"]
    assert rows["kind-alibi"] == ["queued", "1_1", "training (Priority)"]
    assert rows["kind-none"] == ["failed", "1_2", "job failed, no checkpoint"]
    assert rows["|"] == ["error:", "the", "loss became nan at step 2"]  # the failed run's log follows it
    assert rows["kind-sinusoidal"][0] == "failed"  # its job is no longer known: it ended before training
    assert ablate.main([str(grid_file), "--cancel"]) == 0
    assert slurm.cancelled() == ["1_0", "1_1"]


CHILD = """
import os, signal, sys, time
from pathlib import Path
d = Path(sys.argv[1])
os.kill(os.getpid(), signal.SIGUSR2)  # Slurm's warning reaches every process of a job: ignored here
if (d / "saved").exists():
    (d / "resumed").write_text((d / "saved").read_text())
    sys.exit(0)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
print("started", flush=True)
(d / "job").write_text(str(os.getppid()))
while not stop:
    time.sleep(0.01)
(d / "saved").write_text("checkpoint")
sys.exit(143)
"""


def test_job_stops_its_child_on_the_warning_signal_and_is_requeued(tmp_path):
    """Slurm's warning before the time limit (USR2, as submitit asks for it), here sent to a
    job of submitit's local executor: the job sends its child SIGTERM (a trainer saves a
    checkpoint), waits for it, and is requeued; the second start finds what was saved."""
    executor = submitit.LocalExecutor(tmp_path / "jobs")
    log = tmp_path / "run" / "train.log"
    job = executor.submit(RunJob("r", [[sys.executable, "-c", CHILD, str(tmp_path)]], str(log), str(tmp_path)))
    for _ in range(600):
        if (tmp_path / "job").exists():
            break
        time.sleep(0.1)
    os.kill(int((tmp_path / "job").read_text()), signal.SIGUSR2)
    assert job.result() == "r"
    assert (tmp_path / "resumed").read_text() == "checkpoint"
    assert log.read_text().count("$ ") == 2 and "started" in log.read_text()


def test_failed_command_fails_the_job_with_the_log_reason(tmp_path):
    executor = submitit.LocalExecutor(tmp_path / "jobs")
    cmd = [sys.executable, "-c", "print('error: no such corpus'); raise SystemExit(2)"]
    job = executor.submit(RunJob("r", [cmd], str(tmp_path / "train.log"), str(tmp_path)))
    with pytest.raises(submitit.core.utils.FailedJobError, match="r: exit 2: error: no such corpus"):
        job.result()


def test_rows_submits_only_the_rows_named(tmp_path, corpus, monkeypatch, capsys):
    slurm = FakeSlurm(tmp_path, monkeypatch)
    grid = slurm_grid(tmp_path, corpus)
    assert ablate.main([str(grid), "--launcher", "slurm", "--rows", "kind-alibi", "kind-none"]) == 0
    train, _ = slurm.scripts()
    assert "#SBATCH --array=0-1%2\n" in train  # two runs, two at once
    record = json.loads((tmp_path / "runs" / "g" / "_slurm" / "jobs.json").read_text())
    assert set(record) == {"kind-alibi", "kind-none"}
    assert "(not in --rows)" in capsys.readouterr().out
