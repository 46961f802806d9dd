"""One training process per run directory, on one machine or across a cluster's hosts.

Two trainings writing into one run directory would leave one run's config beside the
other's checkpoints. The trainer therefore holds ``flock(LOCK_EX | LOCK_NB)`` on the run's
lock file (training/run_dir.py) from before it chooses where to resume until it exits, and
writes its holder into the file: pid, host, Slurm job (if any) and start time, one line of
JSON. The operating system releases the flock when its process dies, however it dies
(``kill -9`` included); a clean exit also empties the file. A grid evaluating a trained run
here holds the same lock, its holder marked "evaluating" (grid/local.py): a second grid
process then leaves the run to it instead of evaluating it twice, and ``--status`` says so.

A shared file system may not carry a flock from one host to another, and a host may die
with its lock, so a holder left in the file is checked before the run is taken: on this
host, its pid must still exist; in Slurm, its job must still be queued or running
(training/slurm.py). A holder that is gone is taken over with a note saying so; one that
cannot be checked (another host, no Slurm to ask) is kept, and the refusal says how to
free it. A job requeued by Slurm keeps its id, so it takes over its own earlier lock. The
file itself stays (removing it would let a waiting process lock a file nobody else sees),
except from a directory the run left empty. Without ``fcntl`` (Windows) nothing is locked.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from typing import Optional

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from ropelab.common.storage import make_dir
from ropelab.common.errors import RunInUseError
from ropelab.common.logs import get_logger
from ropelab.training.run_dir import RunDir
from ropelab.training.slurm import current_job, job_states

logger = get_logger(__name__)

TRAINING, EVALUATING = "training", "evaluating"  # what a holder does with the run (Holder.task)


@dataclass(frozen=True)
class Holder:
    """The process training into a run, as its lock file records it."""

    pid: int
    host: str
    since: str
    slurm_job: Optional[str] = None
    task: str = TRAINING  # or EVALUATING: a grid evaluating a trained run holds it too (grid/local.py)

    @classmethod
    def this_process(cls, task: str = TRAINING) -> Holder:
        return cls(os.getpid(), socket.gethostname(), time.strftime("%Y-%m-%d %H:%M:%S"), current_job(), task)

    @classmethod
    def parse(cls, text: str) -> Optional[Holder]:
        """The holder a lock file names, or None: empty (released), or written by a version
        that relied on the flock alone (one line of prose), which a free flock settles."""
        try:
            record = json.loads(text)
            return cls(int(record["pid"]), str(record["host"]), str(record["since"]), record.get("slurm_job"),
                       str(record.get("task", TRAINING)))
        except (ValueError, KeyError, TypeError):
            return None

    def __str__(self) -> str:
        job = f", Slurm job {self.slurm_job}" if self.slurm_job else ""
        doing = "" if self.task == TRAINING else f" ({self.task})"
        return f"pid {self.pid} on {self.host}{job}, since {self.since}{doing}"

    def gone(self) -> Optional[str]:
        """Why this holder no longer trains, or None while it may (alive, or unknowable)."""
        if self.slurm_job and self.slurm_job == current_job():
            return f"this is the same Slurm job {self.slurm_job}, restarted"
        if self.host == socket.gethostname():
            return None if _pid_exists(self.pid) else f"pid {self.pid} has exited"
        if self.slurm_job:
            states = job_states([self.slurm_job])
            if states is not None:
                state = states.get(self.slurm_job)
                if state is None or not state.live:
                    return f"Slurm job {self.slurm_job} is {state.state if state else 'no longer known'}"
        return None


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _in_use(run: RunDir, holder: str) -> RunInUseError:
    return RunInUseError(f"{run} is in use: {holder} is training or evaluating it. Two processes writing "
                         "one run directory would mix their files, so this one did not start and nothing "
                         "was changed. Wait for the other to finish (or stop it), or train under another "
                         f"name=... (if that process is known to be gone, delete {run.lock})")


def live_holder(run: RunDir) -> Optional[str]:
    """Who trains into ``run`` now, or None; asks without taking the lock or changing a file
    (for a launcher deciding whether to start a run)."""
    if fcntl is None or not run.lock.is_file():
        return None
    with open(run.lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return str(Holder.parse(f.read()) or "another process")
        holder = Holder.parse(f.read())
        fcntl.flock(f, fcntl.LOCK_UN)
    return str(holder) if holder is not None and holder.gone() is None else None


class RunLock:
    """Held while a process trains into ``run`` (or, ``task=EVALUATING``, while a grid evaluates
    it); ``release`` (or process exit) frees it."""

    def __init__(self, run: RunDir, task: str = TRAINING):
        self.run, self.task = run, task
        self.file: Optional[object] = None

    def acquire(self) -> RunLock:
        if fcntl is None:
            return self
        make_dir(self.run.path, "the run directory")
        f = open(self.run.lock, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            text = f.read().strip()
            f.close()
            raise _in_use(self.run, str(Holder.parse(text) or text or "another process")) from None
        f.seek(0)
        previous = Holder.parse(f.read())
        if previous is not None:  # its holder did not release it: a crash, a kill, a lost host
            why = previous.gone()
            if why is None:
                f.close()
                raise _in_use(self.run, str(previous))
            logger.warning(f"note: {self.run.lock} was held by {previous}, which is gone ({why}); taking it over")
        f.seek(0)
        f.truncate()
        f.write(json.dumps(asdict(Holder.this_process(self.task))) + "\n")
        f.flush()
        self.file = f
        return self

    def release(self) -> None:
        if self.file is not None:
            if [p.name for p in self.run.path.iterdir()] == [self.run.lock.name]:
                # Nothing was written (e.g. the data could not be read): leave no empty run behind.
                self.run.lock.unlink(missing_ok=True)
                self.run.path.rmdir()
            else:
                self.file.seek(0)
                self.file.truncate()  # released: the next holder finds no one to check
                self.file.flush()
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
