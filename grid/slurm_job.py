"""What runs inside one of a grid's Slurm jobs: a run's commands, one after another, each a
child process whose output goes to the run's ``train.log``.

submitit pickles a ``RunJob`` at submission (grid/slurm_launcher.py) and calls it in the
job. A run that needs several GPUs trains under ``torchrun`` (``python -m
torch.distributed.run``), one process per GPU, which hands each process its rank, world
size and the master's address (training/runtime.py reads them): ``--standalone`` on one
node; on several, one torchrun per node, its node rank from ``SLURM_NODEID`` and the
master the job's first host.

Stopping in time. Before the time limit (and on preemption, where the cluster signals it)
Slurm sends submitit's signal (USR2) to every process of the job. The children ignore it
(an ignored signal stays ignored across exec): the trainer stops cleanly on SIGTERM, which
this job sends it instead, then waits for it to save a checkpoint and exit; submitit
then requeues the job under the same id, and the run resumes from that checkpoint
(``train.resume=auto``). A SIGTERM from Slurm itself (scancel, preemption) reaches the
trainer directly, which saves a checkpoint the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

try:
    import submitit
except ImportError:  # an optional dependency (pip install ropelab[slurm]); the launcher says so
    submitit = None

from ropelab.common.errors import UserError
from ropelab.grid.job_files import failure_reason, write_files
from ropelab.training.slurm import current_job

PREEMPTION_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
SAVE_SECONDS = 75  # how long a stopped trainer may take to save, within submitit's 90 s warning


class JobFailed(UserError):
    """A command of the job exited with an error; the run's log says why."""


def _ignore_preemption_signals() -> None:
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def torchrun(cmd: list[str], procs_per_node: int, nodes: int, env: dict[str, str]) -> list[str]:
    """``cmd`` (``python -m MODULE …``) under torchrun: the same interpreter and arguments,
    with the launcher between them. On several nodes the rendezvous comes from Slurm's
    environment: node rank, node count, and the job's first host as master."""
    if nodes == 1:
        where = ["--standalone", f"--nproc_per_node={procs_per_node}"]
    else:
        hosts = submitit.JobEnvironment().hostnames
        port = 20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000  # one port per job on shared nodes
        where = [f"--nnodes={nodes}", f"--node_rank={env.get('SLURM_NODEID', '0')}",
                 f"--nproc_per_node={procs_per_node}", f"--master_addr={hosts[0]}", f"--master_port={port}"]
    return [cmd[0], "-m", "torch.distributed.run", *where, *cmd[1:]]


@dataclass
class RunJob:
    """One run's commands in a Slurm job (see the module doc)."""

    name: str
    commands: list[list[str]]
    log: str  # the run's train.log, appended to
    cwd: str  # where the grid was submitted from: the commands' paths are relative to it
    procs_per_node: int = 1  # more than one process (or node): torchrun
    nodes: int = 1
    threads: Optional[int] = None  # CPU threads per process
    files: dict[str, str] = field(default_factory=dict)  # {path: text} written before the commands
    _child: Optional[subprocess.Popen] = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:  # requeued by pickling: a running child is not part of it
        return {**self.__dict__, "_child": None}

    def __call__(self) -> str:
        os.chdir(self.cwd)
        write_files(self.files)
        env = dict(os.environ)
        if self.threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        for cmd in self.commands:
            if self.procs_per_node * self.nodes > 1:
                cmd = torchrun(cmd, self.procs_per_node, self.nodes, env)
            code = self._run(cmd, env)
            if code != 0:
                raise JobFailed(f"{self.name}: {failure_reason(Path(self.log), code)}")
        return self.name

    def _run(self, cmd: list[str], env: dict[str, str]) -> int:
        first_node = env.get("SLURM_NODEID", "0") == "0"  # the others print to the job's own log
        Path(self.log).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log if first_node else os.devnull, "a") as log:
            log.write(f"$ {' '.join(cmd)}  # Slurm job {current_job()} on {socket.gethostname()}\n")
            log.flush()
            self._child = subprocess.Popen(cmd, stdout=log if first_node else None, stderr=subprocess.STDOUT,
                                           env=env, preexec_fn=_ignore_preemption_signals)
            # The main thread must stay free for submitit's signal handler (checkpoint below),
            # which only reads the exit code this thread records.
            waiter = threading.Thread(target=self._child.wait, daemon=True)
            waiter.start()
            waiter.join()
        return self._child.returncode

    def checkpoint(self) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on its signal: stop the child (it saves a checkpoint), wait
        for it, and hand back this job to be requeued, to resume from that checkpoint."""
        child = self._child
        if child is not None and child.returncode is None:
            child.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + SAVE_SECONDS
            while child.returncode is None and time.monotonic() < deadline:
                time.sleep(0.2)
        return submitit.helpers.DelayedSubmission(self)
