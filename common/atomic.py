"""Atomic writes: readers see the old file or directory or the new one, never a mix.

The one implementation that token caches (data/prepare.py), checkpoints and run files
(training/) and Hugging Face exports use. A directory is built in a hidden temporary
sibling, every file in it is flushed to disk, and it is renamed into place; a crash at
any moment leaves at most a temporary sibling, which ``remove_leftovers`` clears.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace the file ``path`` with ``text`` (UTF-8)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace the file ``path`` with ``data``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _temporary(final: Path, tag: str) -> Path:
    return final.with_name(f".{final.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def remove_leftovers(final: Path) -> None:
    """Temporary siblings of ``final`` left by interrupted writes (call while no writer runs)."""
    for path in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(path, ignore_errors=True)
    for path in final.parent.glob(f".{final.name}.old-*"):
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(final: Path, replace: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory; on success it becomes ``final``.

    ``final`` must not exist or be an empty directory, unless ``replace`` is set, when an
    existing one is swapped out (moved aside, the new one renamed in, the old removed).
    On an exception the temporary directory is removed and ``final`` is untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(final, "tmp")
    tmp.mkdir()
    try:
        yield tmp
        for path in tmp.rglob("*"):
            if path.is_file():
                _fsync(path)
        _fsync(tmp)
        old = None
        if final.exists():
            if replace:
                old = _temporary(final, "old")
                final.rename(old)
            else:
                final.rmdir()  # only an empty directory may be taken over (OSError otherwise)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _fsync(final.parent)
