"""``ropelab ablate GRID --status``: every run of a grid in one table, from its run
directory (trained how far, evaluated or not, who holds its lock) and the grid's Slurm
jobs (grid/slurm_launcher.py records them; squeue and sacct say how they are):

    done         trained to the end (and whether its evaluation is cached)
    running      its job is running (job id), or a process holds its lock (pid and host;
                 "(evaluating)" where a grid here evaluates the trained run)
    queued       its job waits in Slurm's queue (and squeue's reason)
    failed       its job failed before the run was done, or its last session stopped on an
                 error; the last lines of its log follow the row
    stopped      cancelled, timed out or preempted after a checkpoint (the log's last lines
                 follow), or interrupted here: the next submission resumes it
    not started  nothing trained yet
    conflict     its directory holds another experiment
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

from ropelab.configs.grid import Grid, PlannedRun
from ropelab.grid.jobs import evaluation_cached
from ropelab.grid.job_files import log_tail
from ropelab.grid.slurm_launcher import jobs_dir, recorded_states
from ropelab.training.run_dir import RunDir
from ropelab.training.metrics import last_step_record
from ropelab.training.run_lock import live_holder
from ropelab.training.slurm import JobState

TAIL_LINES = 3
ACTIVE = ("RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING")
STOPPED = ("CANCELLED", "TIMEOUT", "PREEMPTED")  # ended from outside, after a checkpoint


@dataclass
class Row:
    state: str
    job: str = "-"
    detail: str = ""
    tail: list[str] = field(default_factory=list)


def _live_row(jobs: dict[str, str], known: dict[str, JobState], detail: str,
              progress: Callable[[], str]) -> Optional[Row]:
    for kind, what in (("train", "training"), ("eval", "evaluation")):
        state = known.get(jobs.get(kind, ""))
        if state is not None and state.live:
            logged = progress() if kind == "train" and state.state in ACTIVE else ""
            words = [what, detail if kind == "train" else "", state.reason and f"({state.reason})",
                     f"({logged})" if logged else ""]
            return Row("running" if state.state in ACTIVE else "queued", jobs[kind], " ".join(w for w in words if w))
    return None


def live_progress(run_dir: RunDir, state: str, now: Optional[float] = None) -> str:
    """How far a run in training has gone past its last checkpoint: the step its training last
    logged ("logged step 2650, 3,261 tok/s, 12 s ago"); "" for a run trained to the end (its
    evaluations run as commands of their own, after the trainer let go of the run) or one that
    logged nothing yet. Just after a resume the last entry may be the earlier session's: its age
    says so."""
    if state == "done":
        return ""
    try:
        entry = last_step_record(run_dir.metrics)
    except OSError:
        entry = None
    if entry is None:
        return ""
    bits = [f"logged step {entry['step']}"]
    if isinstance(entry.get("tokens_per_sec"), (int, float)):
        bits.append(f"{entry['tokens_per_sec']:,.0f} tok/s")
    if isinstance(entry.get("time"), (int, float)):
        bits.append(f"{_age(max(0.0, (now or time.time()) - entry['time']))} ago")
    return ", ".join(bits)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def run_row(run: PlannedRun, state: str, detail: str, jobs: dict[str, str], known: dict[str, JobState]) -> Row:
    """How one run stands (see the module doc)."""
    run_dir = RunDir.of(run.cfg)
    live = _live_row(jobs, known, detail, lambda: live_progress(run_dir, state))
    if live is not None:
        return live
    holder = live_holder(run_dir)
    if holder:
        return Row("running", "-", f"by {holder}" + "".join(f", {d}" for d in (detail, live_progress(run_dir, state)) if d))
    if state == "conflict":
        return Row("conflict", "-", detail)
    train, ev = jobs.get("train"), jobs.get("eval")
    if state == "done":
        ended = known.get(ev or "")
        if ended is not None and ended.state != "COMPLETED":
            return Row("done", ev, f"{detail}; evaluation {ended.state.lower()}", log_tail(run_dir.log, TAIL_LINES))
        return Row("done", train or "-", f"{detail}, {'evaluated' if evaluation_cached(run) else 'not evaluated'}")
    tail = log_tail(run_dir.log, TAIL_LINES)
    if train is not None:  # a job trained it and ended before the run did
        ended = known.get(train)
        how = ended.state if ended else "ENDED"
        stopped = how in STOPPED and state == "partial"
        return Row("stopped" if stopped else "failed", train, f"job {how.lower()}, {detail or 'no checkpoint'}", tail)
    if any(line.startswith("error:") for line in tail):
        return Row("failed", "-", detail or "no checkpoint", tail)
    return Row("stopped", "-", detail) if state == "partial" else Row("not started")


def print_status(grid: Grid, runs: list[PlannedRun], states: dict[str, tuple[str, str]]) -> int:
    record, known = recorded_states(grid)
    print(f"grid {grid.name}: {len(runs)} runs in {grid.runs_dir}"
          + (f" (Slurm jobs: {jobs_dir(grid) / 'jobs.json'})" if record else ""))
    if record and known is None:
        print("  (squeue is not on PATH here: the jobs' states are unknown; run --status on the cluster)")
    rows = {run.name: run_row(run, *states[run.name], record.get(run.name, {}), known or {}) for run in runs}
    width = max([40, *(len(name) for name in rows)])
    print(f"  {'run':<{width}} {'state':<12} {'job':<12} detail")
    for name, row in rows.items():
        print(f"  {name:<{width}} {row.state:<12} {row.job:<12} {row.detail}")
        for line in row.tail:
            print(f"  {'':<{width}}   | {line[:160]}")
    counts = Counter(row.state for row in rows.values())
    print("  " + ", ".join(f"{n} {state}" for state, n in counts.most_common()))
    return 0
