"""A lent machine's session in one folder: what ``ropelab device-session`` brings back.

A machine lent for a few minutes (a GPU with no network) should only run: the grid trains and
evaluates as many runs as fit before the deadline (``ropelab ablate --until``, grid/deadline.py),
each finished, evaluated run is kept as a record in the grid's archive (grid/archive.py), and
this module copies the records written in the session, with a ``session.json`` that says what
ran where (commit, device, torch, the runs, the time), into one folder to carry back. Copied
into the same grid's archive on another machine, the records make those runs done there
(the grid restores them before it plans).
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from pathlib import Path
from typing import Optional

import torch

from ropelab.common.atomic import write_text_atomic
from ropelab.common.errors import ConfigError, UserError
from ropelab.configs.grid import Grid


def check_session(grid: Grid, out: Path) -> None:
    """Refuse, before any work, a grid without an archive (nothing would come back) and an
    output folder that holds something other than an earlier session's records."""
    if not grid.archive:
        raise ConfigError(f"{grid.source}: a device session brings back each run as a record in the grid's archive, "
                          "and this grid has none; add an archive: directory to the grid (docs/configs.md, "
                          "\"Keeping a grid's runs\")")
    if out.exists() and (not out.is_dir() or any(p.name not in ("records", "session.json", "bench.json")
                                                  for p in out.iterdir())):
        raise UserError(f"--out {out} holds something other than a device session's records; give an empty or new "
                        "folder")


def records_since(grid: Grid, started: float) -> list[Path]:
    """The grid's archived records written or refreshed since ``started`` (a time.time())."""
    archive = Path(grid.archive)
    if not archive.is_dir():
        return []
    return sorted(p for p in archive.iterdir() if p.is_dir() and _newest(p) >= started)


def _newest(path: Path) -> float:
    return max((p.stat().st_mtime for p in path.rglob("*")), default=path.stat().st_mtime)


def collect(grid: Grid, started: float, out: Path, commit: Optional[str], exit_code: int,
            bench: Optional[Path] = None) -> dict:
    """Copy the session's records into ``out/records/<grid name>/`` and write ``out/session.json``."""
    records = records_since(grid, started)
    target = out / "records" / grid.name
    target.mkdir(parents=True, exist_ok=True)
    for record in records:
        shutil.rmtree(target / record.name, ignore_errors=True)
        shutil.copytree(record, target / record.name)
    summary = {"grid": str(grid.source), "archive": str(grid.archive), "git_commit": commit,
               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
               "torch": torch.__version__, "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
               "seconds": round(time.time() - started, 1), "grid_exit_code": exit_code,
               "records": [r.name for r in records], "bench": None if bench is None else str(bench.name)}
    write_text_atomic(out / "session.json", json.dumps(summary, indent=1) + "\n")
    return summary
