"""Where a result came from: the project's git commit, recorded in checkpoints and reports."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
# The project's code: a change here, committed or not, can change a number. A new file that
# git does not track yet counts too (a module imported by the code under test). Files
# elsewhere do not, tracked or not: notes, a scratch script at the top level, and the
# committed reports under docs/ that a grid writes again into its own working tree (which
# once marked every run it trained after its report "-dirty").
CODE = ("common", "model", "configs", "data", "training", "eval", "scripts", "train.py")


def git_commit(root: Path = ROOT, code: tuple[str, ...] = CODE) -> Optional[str]:
    """The commit of ``root`` with "-dirty" if a file inside the ``code`` paths differs from it
    (changed, deleted or untracked), or None outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        tracked = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *code], cwd=root,
                                 capture_output=True, text=True, timeout=10).stdout.strip()
        untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "--", *code], cwd=root,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if tracked or untracked else "")) if sha else None


def is_dirty(commit: Optional[str]) -> bool:
    """Whether ``commit`` (as git_commit gives it) names a tree whose code differed from it."""
    return bool(commit) and commit.endswith("-dirty")
