"""A grid on a real Slurm: submit, stop two jobs midway, resubmit, and compare with the same
grid trained here. Needs a running Slurm whose jobs see this file system
(``sudo scripts/slurm_local.sh start`` makes one on this machine); excluded by default:

    python -m pytest -m slurm -s tests/integration/test_slurm_cluster.py

docs/cluster-slurm-test.md records a run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("submitit")

from helpers.runs import write_grid
from ropelab.scripts import ablate
from ropelab.training.slurm import job_states

pytestmark = [pytest.mark.slurm,
              pytest.mark.timeout(3600),  # waits on the cluster's queue, up to WAIT_SECONDS a wait
              pytest.mark.skipif(shutil.which("sbatch") is None or subprocess.run(
                  ["sinfo"], capture_output=True).returncode != 0, reason="no Slurm answers here")]

WAIT_SECONDS = 900


def cluster_grid(tmp: Path, corpus: Path, name: str, out: Path, kinds: str, steps: int, slurm: str) -> Path:
    return write_grid(tmp, corpus, name=name, file=f"{name}-{out.name}", out_dir=out / "runs",
                      overrides=[f"train.max_steps={steps}", f"train.eval_interval={steps // 2}", "train.ckpt_interval=25"],
                      axes=f"{{model.pos.kind: {kinds}}}",
                      eval={"lengths": [16, 32, 64], "protocols": ["nonoverlap"], "scalings": ["none"], "max_tokens": 1024},
                      report=out / "report", slurm=slurm)

def wait_for(condition, what: str, seconds: float = WAIT_SECONDS):
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def ended(*ids: str) -> bool:
    states = job_states(ids)
    return states is not None and not any(state.live for state in states.values())


def jobs(grid_dir: Path) -> dict:
    return json.loads((grid_dir / "_slurm" / "jobs.json").read_text())


def final(run_dir: Path) -> dict:
    """The last training loss and the last validation loss the run logged."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    valid = [r for r in records if "val_loss" in r]
    return {"step": train[-1]["step"], "loss": train[-1]["loss"], "val_loss": valid[-1]["val_loss"]}


def scores(report: Path) -> dict:
    rows = json.loads((report / "results.json").read_text())["results"]
    return {(r["name"], r["length"], r["protocol"]): r["ppl"] for r in rows}


def log(capsys, message: str, start: float) -> None:
    """A line for the record (docs/cluster-slurm-test.md), past pytest's capture."""
    with capsys.disabled():
        print(f"\n[{time.monotonic() - start:6.1f} s] {message}", flush=True)


def test_grid_on_slurm_resumes_stopped_jobs_and_matches_a_local_run(tmp_path, corpus, capsys):
    start = time.monotonic()
    slurm = "{gpus_per_run: 0, cpus_per_run: 1, time: 10}"
    grid = cluster_grid(tmp_path, corpus, "cluster", tmp_path / "slurm", "[rope, alibi, none]", 600, slurm)
    grid_dir = tmp_path / "slurm" / "runs" / "cluster"
    assert ablate.main([str(grid), "--launcher", "slurm"]) == 0
    first = jobs(grid_dir)
    log(capsys, f"submitted: {first}", start)
    # Submitting again while the jobs wait or run submits nothing.
    capsys.readouterr()
    assert ablate.main([str(grid), "--launcher", "slurm"]) == 0
    assert capsys.readouterr().out.count("not submitted: job") == 3 and jobs(grid_dir) == first

    # alibi: cancelled (Slurm sends SIGTERM); none: the time-limit warning (USR2), so requeued.
    alibi, none = grid_dir / "kind-alibi", grid_dir / "kind-none"
    wait_for(lambda: (alibi / "checkpoints" / "step_000050").exists(), "alibi's step 50")
    subprocess.run(["scancel", first["kind-alibi"]["train"]], check=True)
    wait_for(lambda: (none / "checkpoints" / "step_000050").exists(), "none's step 50")
    subprocess.run(["scancel", "--signal=USR2", first["kind-none"]["train"]], check=True)
    log(capsys, "cancelled alibi's job, sent none's job the time-limit warning", start)
    stopped = wait_for(lambda: re.search(r"stopped by SIGTERM at step (\d+)", (alibi / "train.log").read_text()),
                       "alibi's checkpoint on SIGTERM")
    log(capsys, f"alibi stopped at step {stopped.group(1)}", start)
    resumed = wait_for(lambda: re.search(r"resuming .* from (step_\d+)", (none / "train.log").read_text()),
                       "none's requeued job to resume")
    log(capsys, f"none's job was requeued and resumed from {resumed.group(1)}", start)

    # Its evaluation can never start now: Slurm cancels it (kill-on-invalid-dep).
    wait_for(lambda: ended(*first["kind-alibi"].values()), "alibi's jobs to end")
    capsys.readouterr()
    assert ablate.main([str(grid), "--launcher", "slurm", "--report"]) == 0
    out = capsys.readouterr().out
    second = jobs(grid_dir)
    log(capsys, f"resubmitted, then waited and reported: {second}", start)
    assert second["kind-alibi"]["train"] != first["kind-alibi"]["train"]  # a new job for alibi only
    assert {second[k]["train"] for k in ("kind-rope", "kind-none")} == {first[k]["train"] for k in ("kind-rope", "kind-none")}
    assert "3/3 runs finished" in out
    assert f"resuming {alibi} from step_{int(stopped.group(1)):06d}" in (alibi / "train.log").read_text()
    none_log = (none / "train.log").read_text()
    assert re.search(r"stopped by SIGTERM at step \d+", none_log) and "resuming" in none_log
    trainings = re.findall(r"-m ropelab.train .*# Slurm job (\S+)", none_log)
    assert len(trainings) == 2 and len(set(trainings)) == 1  # one job, started twice

    # The same grid trained and evaluated here, one thread per run like the Slurm jobs.
    local = cluster_grid(tmp_path, corpus, "cluster", tmp_path / "local", "[rope, alibi, none]", 600, slurm)
    assert ablate.main([str(local), "--threads", "1"]) == 0
    log(capsys, "trained the same grid here", start)
    for name in ("kind-rope", "kind-alibi", "kind-none"):
        assert final(grid_dir / name) == final(tmp_path / "local" / "runs" / "cluster" / name), name
        log(capsys, f"{name}: Slurm {final(grid_dir / name)} = here", start)
    on_slurm = scores(tmp_path / "slurm" / "report")
    assert on_slurm == scores(tmp_path / "local" / "report")
    log(capsys, f"evaluation: the {len(on_slurm)} perplexities are equal, e.g. {sorted(on_slurm.items())[:3]}", start)


def test_multi_gpu_run_trains_under_torchrun(tmp_path, corpus, capsys):
    """Two (stand-in) GPUs for one run: torchrun starts two ranks, which train data-parallel
    (gloo on a CPU machine); the tokens per step double."""
    start = time.monotonic()
    slurm = "{gpus_per_run: 2, cpus_per_run: 2, time: 10}"
    grid = cluster_grid(tmp_path, corpus, "ddp", tmp_path, "[rope]", 20, slurm)
    assert ablate.main([str(grid), "--launcher", "slurm", "--skip-eval", "--report"]) == 0
    text = (tmp_path / "runs" / "ddp" / "kind-rope" / "train.log").read_text()
    assert "-m torch.distributed.run --standalone --nproc_per_node=2 -m ropelab.train" in text
    assert "512 tokens/step" in text and "× 2" in text and "done: 20 steps" in text
    log(capsys, "\n".join(line for line in text.splitlines() if not line.startswith("step")), start)
