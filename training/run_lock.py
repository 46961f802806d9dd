"""One training process per run directory: an exclusive lock on its ``run.lock``.

Two trainings writing into one run directory would leave one run's config beside the
other's checkpoints. The trainer therefore holds ``flock(LOCK_EX | LOCK_NB)`` on the run's
lock file (training/run_dir.py) from before it chooses where to resume until it exits,
and a second process is refused with the holder's pid, host and start time. The
operating system releases the lock when its process dies, however it dies (``kill -9``
included), so a crashed run never leaves it stuck; the file itself stays (removing it
would let a waiting process lock a file nobody else sees), except from a directory the
run left empty. Without ``fcntl`` (Windows) nothing is locked.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Optional

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

from common.storage import make_dir
from common.errors import RunInUseError
from training.run_dir import RunDir


class RunLock:
    """Held while a process trains into ``run``; ``release`` (or process exit) frees it."""

    def __init__(self, run: RunDir):
        self.run = run
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
            holder = f.read().strip() or "another process"
            f.close()
            raise RunInUseError(f"{self.run} is in use: {holder} is training into it. Two trainings in one run "
                                "directory would mix their files, so this one did not start and nothing was "
                                "changed. Wait for the other to finish (or stop it), or train under another "
                                "name=...") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        f.flush()
        self.file = f
        return self

    def release(self) -> None:
        if self.file is not None:
            if [p.name for p in self.run.path.iterdir()] == [self.run.lock.name]:
                # Nothing was written (e.g. the data could not be read): leave no empty run behind.
                self.run.lock.unlink(missing_ok=True)
                self.run.path.rmdir()
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
