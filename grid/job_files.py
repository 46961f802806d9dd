"""The files around one command of a grid's job, for the launchers (``ropelab ablate``,
grid/slurm_job.py): the files written before it runs, and the log it appends to, whose
last lines say how it went. Only the standard library, so a Slurm job's own process
starts at once and stays small (its commands import torch themselves).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def write_files(files: dict[str, str]) -> None:
    """Write each {path: text}, making parent directories."""
    for path, text in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)


def log_tail(log: Path, lines: Optional[int] = None) -> list[str]:
    """The last ``lines`` (default: all) non-empty lines of a log ([] when there is none)."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return []
    kept = [line for line in text.splitlines() if line.strip()]
    return kept[-lines:] if lines else kept


def failure_reason(log: Path, code: int) -> str:
    """Why a command that appended to ``log`` exited with ``code``: its last ``error:`` line
    (every CLI reports a user's mistake so, common/cli.py), else its last line."""
    lines = log_tail(log)
    errors = [line for line in lines if line.startswith("error:")]
    reason = (errors[-1] if errors else (lines[-1] if lines else "no output"))[:300]
    return f"exit {code}: {reason} (log: {log})"
