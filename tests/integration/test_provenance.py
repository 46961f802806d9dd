"""The commit a result records: clean only when nothing that could change a number differs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ropelab.training.provenance import git_commit


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def test_only_files_inside_the_packages_make_the_tree_dirty(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "a.py").write_text("x = 1\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "report.md").write_text("| rope | 12.3 |\n")
    (tmp_path / ".gitignore").write_text("runs/\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    sha = _git(tmp_path, "rev-parse", "HEAD")
    code = ("model", "train.py")
    assert git_commit(tmp_path, code) == sha
    (tmp_path / "notes.txt").write_text("scratch\n")  # untracked, outside the code: still clean
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x.py").write_text("")  # ignored
    assert git_commit(tmp_path, code) == sha
    # A committed report written again (a grid writes its report into the tree it runs in): still clean.
    (tmp_path / "docs" / "report.md").write_text("| rope | 12.4 |\n")
    assert git_commit(tmp_path, code) == sha
    (tmp_path / "model" / "b.py").write_text("y = 2\n")  # a new module the code may import
    assert git_commit(tmp_path, code) == sha + "-dirty"
    (tmp_path / "model" / "b.py").unlink()
    (tmp_path / "model" / "a.py").write_text("x = 2\n")  # a tracked change
    assert git_commit(tmp_path, code) == sha + "-dirty"
    (tmp_path / "model" / "a.py").unlink()  # a deleted one
    assert git_commit(tmp_path, code) == sha + "-dirty"
    assert git_commit(tmp_path / "model" / "missing", code) is None  # not a directory git can run in
