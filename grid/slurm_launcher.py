"""Run a grid on a Slurm cluster through submitit: ``ropelab ablate GRID --launcher slurm``.

Each run that needs training becomes a task of one job array, with the resources of the
grid's ``slurm:`` section (configs/slurm.py); each of those runs' evaluation a task of a
second array that starts once its own run's training task has succeeded
(``--dependency=aftercorr``), so a failed run is not evaluated and no run waits for the
others. A finished run whose evaluation is missing gets an evaluation job alone. Job ids go
to ``<out_dir>/<grid>/_slurm/jobs.json`` (submitit's job scripts and logs beside it, in
``logs/``), which ``--status``, ``--cancel`` and ``--report`` read. (No run is named
``_slurm``: run names never start with an underscore.)

Submitting again is safe: a run whose recorded job is still queued or running, or whose
lock has a live holder (training/run_lock.py), is left alone; a finished run is not trained
again; a failed, cancelled, timed-out or preempted one is submitted again and resumes from
its newest checkpoint (``train.resume=auto``). What happens inside a job (torchrun for
several GPUs, checkpoint and requeue before the time limit) is grid/slurm_job.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

try:
    import submitit
except ImportError:  # an optional dependency: check_slurm says how to install it
    submitit = None

from ropelab.common.atomic import write_text_atomic
from ropelab.common.errors import ConfigError, UserError
from ropelab.common.logs import get_logger
from ropelab.configs.grid import Grid, PlannedRun
from ropelab.configs.loader import load_yaml
from ropelab.configs.slurm import EXAMPLE, SlurmConfig, minutes
from ropelab.grid.jobs import eval_commands, evaluation_cached, planned_eval_file, train_command
from ropelab.grid.slurm_job import RunJob
from ropelab.training.run_dir import RunDir
from ropelab.training.run_lock import live_holder
from ropelab.training.slurm import JobState, job_states

logger = get_logger(__name__)

POLL_SECONDS = 30  # how often --report asks Slurm whether the grid's jobs have ended


class SlurmError(UserError):
    """Slurm cannot be used as asked (not installed here, or it refused a job)."""


def check_slurm() -> None:
    """Refuse ``--launcher slurm`` before any work where it cannot submit."""
    if submitit is None:
        raise SlurmError("--launcher slurm submits through submitit, which is not installed; install it with "
                         "pip install 'ropelab[slurm]' (or pip install submitit), or use --launcher local")
    if shutil.which("sbatch") is None:
        raise SlurmError("--launcher slurm needs Slurm's sbatch, which is not on PATH here; run this on the "
                         "cluster's login node (scripts/slurm_local.sh starts a one-machine Slurm for trying "
                         "it), or use --launcher local")
    if shutil.which("srun") is None:  # submitit starts each job's tasks with srun, and refuses to submit without it
        raise SlurmError("--launcher slurm needs Slurm's srun beside sbatch (submitit starts each job with it), and "
                         "srun is not on PATH here; run this on a node with Slurm's client commands (the cluster's "
                         "login node), add Slurm's bin directory to PATH, or use --launcher local")


def resources(grid: Grid, overrides: list[str]) -> SlurmConfig:
    """The grid's ``slurm:`` section with ``--slurm KEY=VALUE`` overrides (``sbatch.qos=high``
    sets one sbatch option); refused when a key a submission needs is missing."""
    tree: dict = {}
    for text in overrides:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise ConfigError(f"--slurm {text!r} is not KEY=VALUE (e.g. time=4:00:00 or sbatch.qos=high)")
        if key.startswith("sbatch."):
            tree.setdefault("sbatch", {})[key.split(".", 1)[1]] = load_yaml(value)
        else:
            tree[key] = load_yaml(value)
    res = (grid.slurm or SlurmConfig()).with_overrides(tree, "--slurm" if overrides else str(grid.source))
    missing = res.missing()
    if missing:
        where = "its slurm: section" if grid.slurm else "a slurm: section"
        raise ConfigError(f"{grid.source} does not say what each run needs from Slurm: add {', '.join(missing)} "
                          f"to {where} (e.g. {EXAMPLE}), or give them as --slurm "
                          + " ".join(f"{key}=..." for key in missing))
    return res


# ---------------------------------------------------------------- the grid's job record

def jobs_dir(grid: Grid) -> Path:
    return grid.runs_dir / "_slurm"


def read_jobs(grid: Grid) -> dict[str, dict[str, str]]:
    """{run name: {"train": job id, "eval": job id}}, the latest submission of each."""
    path = jobs_dir(grid) / "jobs.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _record(grid: Grid, kind: str, jobs: dict[str, str]) -> None:
    record = read_jobs(grid)
    for name, job in jobs.items():
        record.setdefault(name, {})[kind] = job
    jobs_dir(grid).mkdir(parents=True, exist_ok=True)
    write_text_atomic(jobs_dir(grid) / "jobs.json", json.dumps(record, indent=1, sort_keys=True) + "\n")


def recorded_states(grid: Grid) -> tuple[dict[str, dict[str, str]], Optional[dict[str, JobState]]]:
    """The grid's recorded jobs, and the state of those Slurm still knows (None: Slurm cannot
    be asked from here)."""
    record = read_jobs(grid)
    return record, job_states(job for jobs in record.values() for job in jobs.values())


def _live_jobs(grid: Grid, flag: str) -> tuple[dict[str, dict[str, str]], list[str]]:
    record, known = recorded_states(grid)
    if known is None:
        raise SlurmError(f"{flag} asks Slurm about the grid's jobs, but squeue is not on PATH here (or did not "
                         "answer); run it on the cluster's login node")
    return record, sorted(job for job, state in known.items() if state.live)


# ---------------------------------------------------------------- submitting

@dataclass
class Plan:
    train: list[PlannedRun] = field(default_factory=list)
    eval_only: list[PlannedRun] = field(default_factory=list)  # trained, evaluation missing
    left: dict[str, str] = field(default_factory=dict)  # run name -> why nothing is submitted


def plan(runs: list[PlannedRun], states: dict[str, tuple[str, str]], evaluate: bool,
         record: dict[str, dict[str, str]], known: dict[str, JobState]) -> Plan:
    """What to submit for each run, from its directory's state (new, partial, done, conflict)
    and its recorded jobs."""
    todo = Plan()
    for run in runs:
        state, detail = states[run.name]
        jobs = record.get(run.name, {})
        busy = [jobs[kind] for kind in ("train", "eval") if jobs.get(kind) in known and known[jobs[kind]].live]
        holder = None if busy or state == "conflict" else live_holder(RunDir.of(run.cfg))
        if state == "conflict":
            todo.left[run.name] = detail
        elif busy:
            todo.left[run.name] = f"job {busy[0]} is {known[busy[0]].state.lower()}"
        elif holder:
            todo.left[run.name] = f"in use by {holder}"
        elif state != "done":
            todo.train.append(run)
        elif evaluate and not evaluation_cached(run):
            todo.eval_only.append(run)
        else:
            todo.left[run.name] = "done" + (", evaluated" if evaluate else "")
    return todo


def _executor(grid: Grid, res: SlurmConfig, kind: str, dependency: Optional[str] = None):
    train = kind == "train"
    executor = submitit.AutoExecutor(folder=jobs_dir(grid) / "logs" / "%j", cluster="slurm")
    extra = dict(res.sbatch)
    if dependency:  # a dependency that can never be met cancels the job instead of leaving it queued
        extra.update({"dependency": dependency, "kill-on-invalid-dep": "yes"})
    params = dict(name=f"{grid.name}-{kind}", nodes=res.nodes if train else 1, tasks_per_node=1,
                  timeout_min=minutes(res.time if train or not res.eval_time else res.eval_time, "time"),
                  gpus_per_node=res.gpus_per_node if train else min(res.gpus_per_run, 1),
                  cpus_per_task=res.cpus_per_run, slurm_partition=res.partition, slurm_account=res.account,
                  slurm_constraint=res.constraint, slurm_mem=res.mem, slurm_additional_parameters=extra or None)
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor


def _submit(grid: Grid, res: SlurmConfig, runs: list[PlannedRun], kind: str, what: str,
            dependency: Optional[str] = None) -> list:
    """One array of ``kind`` jobs for ``runs`` (a plain job for one run), recorded as soon as
    sbatch has taken it; sbatch's refusal becomes one error line, and nothing is recorded."""
    executor = _executor(grid, res, kind, dependency)
    try:
        with contextlib.redirect_stderr(io.StringIO()), executor.batch():  # submitit echoes sbatch's errors
            jobs = [executor.submit(job) for job in _run_jobs(grid, runs, res, kind)]
    except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError) as e:
        lines = [line.split("error:", 1)[-1].strip() for line in str(e).splitlines() if line.strip()]
        raise SlurmError(f"sbatch refused the {'training' if kind == 'train' else 'evaluation'} jobs of "
                         f"{len(runs)} runs: {'; '.join(lines) or 'no reason given'}. Nothing of it was submitted; "
                         "fix the grid's slurm: section (or --slurm) and submit again") from None
    _record(grid, kind, {run.name: job.job_id for run, job in zip(runs, jobs)})
    logger.info(f"submitted {what}: " + ", ".join(f"{run.name} ({job.job_id})" for run, job in zip(runs, jobs)))
    return jobs


def _run_jobs(grid: Grid, runs: list[PlannedRun], res: SlurmConfig, kind: str) -> list[RunJob]:
    threads = res.cpus_per_run and max(1, res.cpus_per_run // max(1, res.gpus_per_node))
    if kind == "train":
        return [RunJob(run.name, [train_command(grid, run)], str(RunDir.of(run.cfg).log), os.getcwd(),
                       procs_per_node=max(1, res.gpus_per_node), nodes=res.nodes, threads=threads) for run in runs]
    device = "auto" if res.gpus_per_run else "cpu"  # auto: the job's GPU
    return [RunJob(run.name, eval_commands(run, device), str(RunDir.of(run.cfg).log), os.getcwd(),
                   threads=res.cpus_per_run, files=planned_eval_file(run)) for run in runs]


def _dependency(train_jobs: list) -> str:
    """Each evaluation task after its own run's training task (aftercorr), or after the one job."""
    first = train_jobs[0].job_id
    return f"aftercorr:{first.split('_')[0]}" if "_" in first else f"afterok:{first}"


def submit_grid(grid: Grid, runs: list[PlannedRun], states: dict[str, tuple[str, str]], res: SlurmConfig,
                evaluate: bool) -> list:
    """Submit what the grid still needs (see the module doc); the submitted submitit jobs."""
    record, known = recorded_states(grid)
    if record and known is None:
        raise SlurmError("squeue did not answer, so whether the grid's recorded jobs still run is unknown; "
                         "nothing was submitted (a run must not get a second job). Try again once it answers")
    todo = plan(runs, states, evaluate, record, known or {})
    for name, why in todo.left.items():
        logger.info(f"  {name:<40} not submitted: {why}")
    submitted = []
    if todo.train:
        train = _submit(grid, res, todo.train, "train", "training")
        submitted += train
        if evaluate:
            submitted += _submit(grid, res, todo.train, "eval", "evaluation, each after its run's training",
                                 _dependency(train))
    if todo.eval_only:
        submitted += _submit(grid, res, todo.eval_only, "eval", "evaluation of trained runs")
    if not submitted:
        logger.info("nothing to submit")
    return submitted


# ---------------------------------------------------------------- following and cancelling

def wait_for_grid(grid: Grid, poll_seconds: float = POLL_SECONDS) -> None:
    """Return once none of the grid's recorded jobs is queued or running."""
    last = None
    while True:
        _, live = _live_jobs(grid, "--report")
        if not live:
            return
        if live != last:
            logger.info(f"waiting for {len(live)} job{'s' if len(live) > 1 else ''} of {grid.name}: {', '.join(live)}")
            last = live
        time.sleep(poll_seconds)


def cancel_grid(grid: Grid) -> int:
    """scancel the grid's recorded jobs that are still queued or running."""
    record, live = _live_jobs(grid, "--cancel")
    if not live:
        logger.info(f"{grid.name}: no queued or running job to cancel ({len(record)} runs recorded)")
        return 0
    if shutil.which("scancel") is None:
        raise SlurmError("--cancel needs Slurm's scancel, which is not on PATH here; run it on the cluster")
    done = subprocess.run(["scancel", *live], capture_output=True, text=True)
    if done.returncode != 0:
        raise SlurmError(f"scancel refused: {' '.join(done.stderr.split())}")
    logger.info(f"cancelled {len(live)} jobs of {grid.name}: {', '.join(live)}. A cancelled training saves a "
                "checkpoint; submit the grid again to resume it.")
    return 0
