"""What a run's lock and a grid's launcher ask Slurm: which job this process runs in, and
the state of jobs by id.

Jobs are named as ``squeue`` names them: ``123``, or ``120_4`` for task 4 of array 120.
``squeue`` knows queued and running jobs, and finished ones for the cluster's MinJobAge
(often five minutes); ``sacct`` knows finished ones after that where accounting is on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable, Optional

# States of a job that may still run (or is running): its run is not free.
LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD",
                         "REQUEUE_FED", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT",
                         "RESV_DEL_HOLD", "SPECIAL_EXIT"})
QUERY_SECONDS = 60  # a busy controller answers slowly, but a query must not hang a grid


@dataclass(frozen=True)
class JobState:
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, CANCELLED, …
    reason: str = ""  # squeue's reason (Priority, Resources, Dependency, …), when it gives one

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


def current_job() -> Optional[str]:
    """The Slurm job this process runs in, or None outside Slurm."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def _run(cmd: list[str]) -> Optional[subprocess.CompletedProcess]:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=QUERY_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _squeue(ids: list[str]) -> Optional[dict[str, JobState]]:
    done = _run(["squeue", "--noheader", "--array", "--states=all", "--format=%i|%T|%r", "--jobs=" + ",".join(ids)])
    if done is None:
        return None
    if done.returncode != 0:
        # One id the controller has forgotten is an error; several give an empty answer.
        return {} if "Invalid job id" in done.stderr else None
    states = {}
    for line in done.stdout.splitlines():
        job, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if job:
            states[job] = JobState(state, "" if reason in ("None", "(null)") else reason)
    return states


def _sacct(ids: list[str]) -> dict[str, JobState]:
    done = _run(["sacct", "--noheader", "--parsable2", "--allocations", "--format=JobID,State", "--jobs=" + ",".join(ids)])
    if done is None or done.returncode != 0:  # no accounting on this cluster
        return {}
    states = {}
    for line in done.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job and state:
            states[job] = JobState(state.split()[0])  # "CANCELLED by 1000" -> CANCELLED
    return states


def job_states(ids: Iterable[str]) -> Optional[dict[str, JobState]]:
    """The state of each job Slurm still knows among ``ids`` (a job it has forgotten is
    absent), or None when Slurm cannot be asked (no ``squeue`` here, or it failed)."""
    ids = sorted(set(ids))
    if not ids:
        return {}
    states = _squeue(ids)
    if states is None:
        return None
    forgotten = [job for job in ids if job not in states]
    if forgotten:
        states.update({job: state for job, state in _sacct(forgotten).items() if job in forgotten})
    return {job: states[job] for job in ids if job in states}
