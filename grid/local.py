"""Training a grid's runs here (``ropelab ablate --launcher local``): one job per slot
at a time, a slot being a CUDA device or a share of the CPU's cores; each run trained, then
evaluated, in its own processes, its output in the run's log, and kept in the grid's
archive at once. With a deadline (``--until``, grid/deadline.py) a run starts only
while its estimate ends by then, and training under way then is stopped at a checkpoint.
A run another process trains or evaluates (a second ``ropelab ablate`` on the grid, or
train.py by hand: its lock names the holder, training/run_lock.py) is not trained or evaluated
here, nor a failure: it is running elsewhere, and the reports wait for it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from ropelab.common.devices import usable_cpus
from ropelab.common.errors import RunInUseError
from ropelab.common.logs import get_logger
from ropelab.configs.grid import Grid, PlannedRun, row_of
from ropelab.grid.archive import archive_runs
from ropelab.grid.deadline import Deadline, wait
from ropelab.grid.estimate import ended_at
from ropelab.grid.jobs import eval_commands, evaluation_cached, planned_eval_file, train_command
from ropelab.grid.job_files import failure_reason, write_files
from ropelab.grid.run_state import status
from ropelab.training.run_dir import RunDir
from ropelab.training.run_lock import EVALUATING, RunLock, live_holder

logger = get_logger(__name__)


@dataclass(frozen=True)
class Slot:
    """Where one job runs: a CUDA device, or CPU threads (None: torch's default)."""

    device: Optional[str] = None
    threads: Optional[int] = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.device and self.device.startswith("cuda:"):
            env["CUDA_VISIBLE_DEVICES"] = self.device.split(":", 1)[1]
        if self.threads:  # single-threaded jobs share cores without OpenMP threads waiting on each other
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        return env


STOPPED = "stopped at the deadline"  # a train_one reason: not a failure, the run resumes later
STOPPED_OUTSIDE = "stopped by SIGTERM from outside the grid"  # one sent to train.py by hand: resumes too
STOPPED_HERE = "stopped by a SIGTERM to ropelab ablate"  # passed on to its jobs (``stop_jobs``): resumes too
LEFT_FOR_LATER = (STOPPED, STOPPED_OUTSIDE, STOPPED_HERE)  # the reasons of a job stopped at its checkpoint


class _Jobs:
    """The jobs' processes under way, so that a SIGTERM to the grid's own process reaches them:
    they are its children, and would otherwise train on, orphaned, with no one to report them."""

    def __init__(self):
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen] = set()

    def add(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.add(proc)
        if self.stopping.is_set():  # set after this job's start was decided: ``stop`` may not have seen it
            _terminate(proc)

    def remove(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.discard(proc)

    def stop(self) -> None:
        self.stopping.set()
        with self.lock:
            procs = list(self.procs)
        for proc in procs:
            _terminate(proc)


def _terminate(proc: subprocess.Popen) -> None:
    try:
        proc.send_signal(signal.SIGTERM)  # train.py saves a checkpoint at the step it is on and exits
    except ProcessLookupError:
        pass


JOBS = _Jobs()


def stop_jobs(signum=None, frame=None) -> None:
    """The SIGTERM handler of ``ropelab ablate``: stop every job under way (its
    training at a checkpoint) and start no other; the runs are left for the same command."""
    JOBS.stop()


@contextlib.contextmanager
def sigterm_stops_jobs():
    """While the grid trains here, a SIGTERM to this process stops its jobs (``stop_jobs``)
    instead of ending it at once with its jobs training on; ``stopped()`` says afterwards."""
    JOBS.stopping.clear()
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set a handler
        yield
        return
    previous = signal.signal(signal.SIGTERM, stop_jobs)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped() -> bool:
    """Whether a SIGTERM stopped the grid's jobs (``stop_jobs``)."""
    return JOBS.stopping.is_set()


def _call(cmd: list[str], log_path: Path, slot: Slot, deadline: Optional[float] = None,
          resumable: bool = False) -> tuple[bool, str]:
    """Run ``cmd`` with its output appended to ``log_path``, stopped with SIGTERM at
    ``deadline`` if it is still running then; (ok, reason). A ``resumable`` command (train.py)
    that handled a SIGTERM sent from elsewhere saved a checkpoint and exits 128 + SIGTERM: the
    reason is then STOPPED_OUTSIDE, not a failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        if JOBS.stopping.is_set():
            return False, STOPPED_HERE
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=slot.env(), cwd=os.getcwd())
        JOBS.add(proc)
        try:
            code, stopped = wait(proc, deadline)
        finally:
            JOBS.remove(proc)
    if JOBS.stopping.is_set() and code != 0:  # one that ended on its own as the SIGTERM came is done
        return False, STOPPED_HERE
    if stopped and code != 0:  # one that ended on its own as the deadline came is done
        return False, STOPPED
    if resumable and code == 128 + signal.SIGTERM:
        return False, STOPPED_OUTSIDE
    return (True, "") if code == 0 else (False, failure_reason(log_path, code))


ELSEWHERE = "running elsewhere, by "  # another process trains or evaluates the run; it names the holder


def train_one(grid: Grid, run: PlannedRun, slot: Slot, deadline: Optional[float] = None) -> tuple[bool, str]:
    """Train (or resume) one run in a subprocess, its output in the run's log, until the
    deadline at most; (ok, reason), the reason ELSEWHERE + the holder where another process
    trains the run (found before it starts, or as train.py's refusal when it took the run
    between that look and train.py's start)."""
    run_dir = RunDir.of(run.cfg)
    holder = live_holder(run_dir)
    if holder:
        return False, ELSEWHERE + holder
    ok, reason = _call(train_command(grid, run, slot.device), run_dir.log, slot, deadline, resumable=True)
    if not ok and reason not in LEFT_FOR_LATER and (holder := live_holder(run_dir)):
        return False, ELSEWHERE + holder
    return ok, reason


def evaluate_one(run: PlannedRun, slot: Slot) -> tuple[bool, str]:
    """Evaluate one finished run in subprocesses with its planned eval config, filling the
    run's evaluation caches (the grid's reports then read them; grid/jobs.py). A run
    whose caches are all filled for its newest checkpoint starts no process (as on Slurm,
    grid/slurm_launcher.py): a grid started again passes its evaluated runs at once."""
    write_files(planned_eval_file(run))  # kept in the run's record (training/run_record.py) either way
    if evaluation_cached(run):
        return True, ""
    run_dir = RunDir.of(run.cfg)
    try:  # held while its evaluations run, as training holds it: one process evaluates a run
        lock = RunLock(run_dir, task=EVALUATING).acquire()
    except RunInUseError:
        return False, ELSEWHERE + (live_holder(run_dir) or "another process")
    try:
        if evaluation_cached(run):  # the process that held it a moment ago evaluated it
            return True, ""
        for cmd in eval_commands(run, slot.device or "cpu"):
            ok, reason = _call(cmd, run_dir.log, slot)
            if not ok:
                return ok, reason
        return True, ""
    finally:
        lock.release()


def run_one(grid: Grid, run: PlannedRun, slot: Slot, trained: bool, evaluate: bool,
            deadline: Optional[Deadline]) -> tuple[bool, str]:
    """One run, in its slot: trained (unless ``trained``), then evaluated and kept in the grid's
    archive at once (the machine may not last the grid); (ok, failure reason), the reason
    STOPPED (or STOPPED_OUTSIDE) where the deadline (or a SIGTERM sent by hand) stopped its
    training at a checkpoint."""
    ok, reason = (True, "") if trained else train_one(grid, run, slot, deadline and deadline.at)
    if reason in LEFT_FOR_LATER or reason.startswith(ELSEWHERE):
        return False, reason
    if ok and evaluate:
        ok, reason = evaluate_one(run, slot)
        if reason in LEFT_FOR_LATER or reason.startswith(ELSEWHERE):  # a SIGTERM stopped it: evaluated
            return False, reason  # again by the same command; or another process evaluates it now
        reason = reason and f"evaluation: {reason}"
    if ok and evaluate and grid.archive:
        _, skipped = archive_runs(grid, [run], {run.name})
        if run.name in skipped:
            ok, reason = False, f"archive: {skipped[run.name]}"
    return ok, reason


class _Progress:
    """The runs' progress, shared by the slots' threads: a bar on a terminal; in a log file one
    line per finished run instead of carriage returns. Collects failures and the runs left."""

    def __init__(self, grid: Grid, total: int, left: dict[str, str], others: dict[str, str]):
        self.bar = tqdm(total=total, desc=f"{grid.name}: runs", unit="run", disable=not sys.stderr.isatty())
        self.lock, self.total, self.left, self.others = threading.Lock(), total, left, others
        self.failures: dict[str, str] = {}
        self.ended_runs = 0

    def started(self, run: PlannedRun, slot: Slot) -> None:
        with self.lock:
            logger.info(f"→ {run.name}" + (f" on {slot.device}" if slot.device else ""))

    def leave(self, run: PlannedRun, why: str, line: str) -> None:  # not a failure: the same command takes it up
        with self.lock:
            logger.info(f"· {run.name}: {line}")
            self.left[run.name] = why
            self.bar.update(1)

    def elsewhere(self, run: PlannedRun, holder: str) -> None:  # another process trains it: not ours, not a failure
        with self.lock:
            logger.info(f"· {run.name}: {ELSEWHERE}{holder}; left to it")
            self.others[run.name] = holder
            self.bar.update(1)

    def ended(self, run: PlannedRun, ok: bool, reason: str) -> None:
        with self.lock:
            if not ok:
                self.failures[run.name] = reason
                logger.info(f"✗ {run.name}: {reason}")
            self.bar.update(1)
            self.ended_runs += 1
            if self.bar.disable:
                logger.info(f"{'✓' if ok else '✗'} {run.name} ({self.ended_runs}/{self.total} runs done)")


def run_all(grid: Grid, todo: list[PlannedRun], slots: list[Slot], evaluate: bool,
            deadline: Optional[Deadline] = None, left: Optional[dict[str, str]] = None,
            elsewhere: Optional[dict[str, str]] = None) -> dict[str, str]:
    """Train the runs that need it and evaluate each, one job per slot at a time, until the
    deadline if there is one; returns {run name: failure reason}. Runs left for later (not
    started by the deadline, or stopped at a checkpoint by it or by a SIGTERM sent to their
    training by hand) go into ``left`` with why; runs another process trains, into
    ``elsewhere`` with that process."""
    jobs: queue.Queue = queue.Queue()
    for run in todo:
        jobs.put(run)
    progress = _Progress(grid, len(todo), {} if left is None else left, {} if elsewhere is None else elsewhere)

    def worker(slot: Slot) -> None:
        while True:
            try:
                run = jobs.get_nowait()
            except queue.Empty:
                return
            if JOBS.stopping.is_set():
                progress.leave(run, f"not started: {STOPPED_HERE}", f"not started, {STOPPED_HERE}")
                continue
            trained = status(run)[0] == "done"
            refusal = deadline.refusal(run.name) if deadline and not trained else None
            if refusal:  # the others in the queue may be shorter, or already trained
                progress.leave(run, f"not started: {refusal}", f"not started, {refusal}")
                continue
            progress.started(run, slot)
            ok, reason = run_one(grid, run, slot, trained, evaluate, deadline)
            if reason.startswith(ELSEWHERE):
                progress.elsewhere(run, reason.removeprefix(ELSEWHERE))
            elif reason in LEFT_FOR_LATER:
                progress.leave(run, f"{reason} (at its checkpoint)",
                               f"{reason}, its checkpoint saved; the same command continues it")
            else:
                if ok and deadline is not None and not trained and (step := ended_at(grid, run)) is not None:
                    deadline.run_ended(row_of(run.name), step)  # before this worker takes its next run
                progress.ended(run, ok, reason)

    threads = [threading.Thread(target=worker, args=(slot,), daemon=True) for slot in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    progress.bar.close()
    return progress.failures


def slots_for(args: argparse.Namespace) -> list[Slot]:
    def cpu_threads(jobs: int) -> Optional[int]:  # jobs sharing the CPUs split them; one job: torch's default
        return args.threads or (max(1, usable_cpus() // jobs) if jobs > 1 else None)
    if args.devices:  # "cpu" may be named more than once: those jobs share the cores
        threads = cpu_threads(args.devices.count("cpu"))
        return [Slot(device=d, threads=threads if d == "cpu" else None) for d in args.devices]
    return [Slot(threads=cpu_threads(args.jobs)) for _ in range(args.jobs)]
