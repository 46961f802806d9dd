"""The file system under everything we write: its refusals become messages a person can act on.

A full disk, a quota, a read-only mount, a missing permission or a path of the wrong kind
(a file where a directory belongs, or the reverse) is not a bug: ``storage_error`` turns
the ``OSError`` into a ``StorageError`` that names the path and says what to do, and
``common.cli.entry_point`` does the same for any such error that reaches it.

Two writers hide the ``OSError`` behind their own exception: ``torch.save`` (a
``RuntimeError`` such as "unexpected pos 704 vs 598") and safetensors (a
``SafetensorError`` whose text ends in "(os error 28)"). ``RecordingWriter`` and
``os_error_in`` recover the real cause.
"""

from __future__ import annotations

import errno
import io
import os
import re
import shutil
from pathlib import Path
from typing import Optional

from ropelab.common.errors import StorageError

_ADVICE = {
    errno.ENOSPC: "the disk is full: free some space (or point the path elsewhere)",
    errno.EDQUOT: "the disk quota is used up: free some space",
    errno.EFBIG: "the file is larger than this file system (or a size limit) allows",
    errno.EROFS: "the file system is read-only: choose a writable location",
    errno.EACCES: "permission denied: choose a location you can write to, or change its permissions",
    errno.EPERM: "the operation is not permitted here: choose another location",
    errno.ENOTDIR: "part of this path is a file where a directory is needed: choose another path "
                   "or move the file away",
    errno.EISDIR: "this is a directory where a file is needed: give the path of a file",
    errno.EEXIST: "a file already exists where a directory is needed: choose another path or move "
                  "the file away",
    errno.ENAMETOOLONG: "the path is too long for this file system: choose a shorter one",
}


# What a trainer stopped by a full disk says to do next.
CONTINUE_RUN = "the checkpoints saved before are intact: continue with --resume once there is space"


def is_storage_error(error: BaseException) -> bool:
    """True for file-system refusals a user can fix (full disk, permissions, path kinds)."""
    return isinstance(error, OSError) and error.errno in _ADVICE


def _free_space(path: Optional[Path]) -> str:
    """'; N MB free there' when the file system of ``path`` (or a parent) can be asked."""
    while path is not None and not path.exists() and path != path.parent:
        path = path.parent
    try:
        free = shutil.disk_usage(path).free if path is not None else None
    except OSError:
        return ""
    return "" if free is None else f" ({free / 2**20:,.0f} MB free there)"


def describe(error: OSError, path: Optional[Path] = None) -> str:
    """One sentence: which path, what the system said, and what to do."""
    where = path or (Path(error.filename) if error.filename else None)
    advice = _ADVICE.get(error.errno, "check the path and the disk")
    space = _free_space(where) if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
    return f"{where if where is not None else 'a file'}: {error.strerror or error}{space}; {advice}"


def storage_error(error: OSError, doing: str, path: Optional[Path] = None,
                  then: str = "then run the same command again") -> StorageError:
    """``StorageError('cannot <doing>: <path>: <reason>; <advice>, <then>')``."""
    return StorageError(f"cannot {doing}: {describe(error, path)}, {then}")


def os_error_in(error: BaseException) -> Optional[OSError]:
    """The ``OSError`` behind ``error``: itself, one recorded by a ``RecordingWriter`` in its
    context, or the ``(os error N)`` that safetensors puts in its message."""
    if isinstance(error, OSError):
        return error
    found = re.search(r"\(os error (\d+)\)", str(error))
    if found:
        code = int(found.group(1))
        return OSError(code, os.strerror(code))
    return None


class RecordingWriter(io.RawIOBase):
    """A binary file wrapper that remembers the ``OSError`` of a failed write, for writers
    (``torch.save``) that replace it with an error of their own."""

    def __init__(self, file):
        super().__init__()
        self.file, self.error = file, None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise


def make_dir(path: str | Path, what: str) -> Path:
    """Create the directory ``path`` (and parents) for ``what`` (e.g. "train.out_dir"),
    or say clearly why it cannot be: a file in the way, no permission, a full disk."""
    path = Path(path)
    blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise StorageError(f"{what}: {path} needs a directory, but {blocking} is a file; choose another "
                           f"path or move the file away (nothing was written)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if not is_storage_error(e):
            raise
        raise storage_error(e, f"create the directory for {what}", path) from None
    return path
