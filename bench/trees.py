"""The code an A/B benchmark measures against this tree's: a temporary git worktree of a
revision (``ropelab bench --compare REV``, ``ropelab bench-eval --compare REV``), and the
environment under which a Python process imports ``ropelab`` from it.

An editable install maps ``ropelab`` to this checkout, so ``PYTHONPATH`` at another tree does
not by itself point ``ropelab`` there. The mapping is a finder that setuptools appends to
``sys.meta_path``, after the path finder, so a ``PYTHONPATH`` directory holding an entry named
``ropelab`` wins: each worktree gets a directory beside it with a symlink ``ropelab`` -> the
worktree, first on ``PYTHONPATH``. A tree from before the folders were one package (fb1bb84)
imports its own modules by bare names (``configs``, ``training``...), so that tree itself goes
on ``PYTHONPATH`` too; its root has no ``__init__.py``, so ``ropelab`` is then a namespace
package over it, and this tree's benchmark worker finds that tree's modules as ``ropelab.X``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from ropelab.common.errors import UserError

ROOT = Path(__file__).resolve().parents[1]  # this checkout: the code "this" measures


@dataclass(frozen=True)
class Tree:
    """A checkout whose code a benchmark process runs; ``imports``: the PYTHONPATH entries
    that make ``import ropelab`` (and a pre-package tree's bare names) resolve to it, none for
    the code this process imports."""

    root: Path
    imports: tuple[Path, ...] = ()

    def env(self, base: Optional[dict[str, str]] = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with ``imports`` first on PYTHONPATH."""
        env = dict(os.environ if base is None else base)
        if self.imports:
            env["PYTHONPATH"] = os.pathsep.join([*map(str, self.imports), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return env

    @property
    def is_package(self) -> bool:
        """Whether the tree is the ``ropelab`` package (fb1bb84 on) rather than folders imported by bare names."""
        return (self.root / "__init__.py").is_file()


THIS = Tree(ROOT)


def importable(root: Path, scratch: Path) -> Tree:
    """``root``'s code, importable as ``ropelab`` through a symlink in ``scratch`` (see the module doc)."""
    link = scratch / "ropelab"
    scratch.mkdir(parents=True, exist_ok=True)
    link.symlink_to(root.resolve(), target_is_directory=True)
    tree = Tree(root)
    return Tree(root, (scratch,) if tree.is_package else (scratch, root))


@contextlib.contextmanager
def tree_at(rev: str) -> Iterator[Tree]:
    """A temporary git worktree of ``rev``, importable as ``ropelab``; removed afterwards."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise UserError(f"--compare {rev}: not a commit of this repository ({sha.stderr.strip()})")
    scratch = Path(tempfile.mkdtemp(prefix="ropelab-bench-base-"))
    path = scratch / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), sha.stdout.strip()], cwd=ROOT,
                   check=True, capture_output=True)
    try:
        yield importable(path, scratch / "imports")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


def git_commit_of(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
