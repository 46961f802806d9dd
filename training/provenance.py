"""Where a result came from: the project's git commit, recorded in checkpoints and reports."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional


def git_commit() -> Optional[str]:
    """The project's current commit (with "-dirty" if tracked files changed), or None outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) if sha else None
