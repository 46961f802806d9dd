"""A grid's archive: its runs kept as records (training/run_record.py) in a directory the grid
names (``archive:``), for example in the repository beside its report, so the grid carries
over to a fresh clone on another machine.

- **Archiving**: once a run has trained and every evaluation the grid plans for it is
  cached (grid/jobs.py), its record is written to ``<archive>/<run name>/``,
  replacing an earlier one. ropelab ablate does this after each run's evaluation and for
  every finished, evaluated run at the end; ``--archive`` does it alone (for a grid that
  trains in another process).
- **Restoring**: before it plans anything, ropelab ablate copies the record of every run
  that has no checkpoint on disk back into the grid's run directory, so the run counts as
  done and its reports read the evaluations the record holds. grid/tune.py does the same.

A record holds no weights (unless the grid keeps them: ``archive_weights: true``, for
parents other grids fine-tune from): changing an evaluation setting of the grid after a run
was archived leaves that run without the new result (it fails with the reason and the report
lists it as missing). Raising its training budget does so with weights too (a record keeps
no optimizer state). The fix is to train it again: remove its record and its run directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from ropelab.common.errors import UserError
from ropelab.configs.grid import Grid, PlannedRun
from ropelab.grid.jobs import not_cached, planned_caches
from ropelab.training.run_dir import RunDir
from ropelab.training.run_record import (is_record, kept_as, record_has_weights, refresh_record, restore_record,
                                 write_record)


def check_archive(grid: Grid) -> None:
    """Refuse the grid's archive before any run trains where no record could be written there:
    a file in its place (or above it), or a directory this user cannot write (it is created on
    the first record where it does not exist yet). Found after the runs, it failed each one
    once trained and evaluated, and the grid wrote no report."""
    if grid.archive is None:
        return
    path = Path(grid.archive)
    blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UserError(f"{grid.source}: archive: {path} must be a directory for the runs' records, but {blocking} "
                        "is a file; move it away or name another directory in the grid's archive: key (nothing "
                        "was trained)")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{grid.source}: archive: {path} cannot be written ({existing} is not writable here); make "
                        f"it writable (chmod u+w {existing}) or name another directory in the grid's archive: key "
                        "(nothing was trained)")


def record_of(grid: Grid, run: PlannedRun) -> Path:
    return Path(grid.archive) / run.cfg.name


def restore_records(grid: Grid, runs: list[PlannedRun]) -> tuple[list[str], list[str]]:
    """Restore the archived record of every run without a checkpoint on disk, and bring records
    restored before up to date with the archive (changed in git since); the names of the runs
    restored and of those brought up to date."""
    if grid.archive is None:
        return [], []
    restored, refreshed = [], []
    for run in runs:
        run_dir, src = RunDir.of(run.cfg), record_of(grid, run)
        if not src.is_dir():
            continue
        if run_dir.path.exists() and run_dir.latest_checkpoint() is not None:
            # the run itself wins over its record; an earlier restore follows the archive
            if is_record(run_dir) and refresh_record(src, run_dir):
                refreshed.append(run.name)
            continue
        restore_record(src, run_dir)
        restored.append(run.name)
    return restored, refreshed


def why_not_archived(run: PlannedRun, finished: bool) -> str:
    """Why ``run`` cannot be archived now ('' when it can)."""
    if not finished:
        return "not finished"
    missing = not_cached(run)
    return f"{', '.join(missing)} not evaluated" if missing else ""


def archive_run(grid: Grid, run: PlannedRun) -> None:
    """Write ``run``'s record to the grid's archive (it must be finished and evaluated)."""
    write_record(RunDir.of(run.cfg), planned_caches(run), record_of(grid, run), weights=grid.archive_weights)


def _evaluated_since(grid: Grid, run: PlannedRun) -> bool:
    """Whether ``run`` holds an evaluation cache the grid plans that its archived record lacks."""
    record, run_dir = record_of(grid, run), RunDir.of(run.cfg)
    return any(cache.is_file() and not (record / kept_as(cache.relative_to(run_dir.path))).is_file()
               for cache in planned_caches(run))


def archive_runs(grid: Grid, runs: list[PlannedRun], finished: set[str]) -> tuple[list[str], dict[str, str]]:
    """Archive every run of ``runs`` that is finished (its name in ``finished``) and evaluated;
    (archived names, {name: why not} for the others). A record restored from the archive is
    not written again, unless it kept its weights and was evaluated anew since (its archived
    copy lacks an evaluation the grid plans)."""
    archived, skipped = [], {}
    for run in runs:
        run_dir = RunDir.of(run.cfg)
        if is_record(run_dir) and not (record_has_weights(run_dir) and _evaluated_since(grid, run)):
            continue
        why = why_not_archived(run, run.name in finished)
        if why:
            skipped[run.name] = why
            continue
        try:
            archive_run(grid, run)
        except (UserError, OSError) as e:
            skipped[run.name] = f"cannot archive: {e}"
            continue
        archived.append(run.name)
    return archived, skipped
