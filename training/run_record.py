"""Run records: a finished, evaluated run without its optimizer state, small enough to keep in git.

A grid whose file names an ``archive`` directory (configs/grid.py) copies each of its runs
there once it has trained and every evaluation the grid plans for it is cached
(grid/archive.py). A record is a run directory (training/run_dir.py) with only::

    config.yaml, tokenizer.json.gz, metrics.jsonl.gz  what it was and how it trained
    checkpoints/latest, checkpoints/step_N/meta.json   its final step, tokens and provenance
    eval/planned.yaml, eval/<kind>-<key>.json.gz      the grid's evaluations of that checkpoint
    record.json                                       what this directory is

so the grid survives the machine it ran on: on a fresh clone, ropelab ablate copies the
records of runs it does not have on disk back into the grid's run directory (and brings
records it restored before up to date with the archive's: ``refresh_record``), counts them
as done, and its reports read their cached evaluations as if the runs had been evaluated
there. A record holds no optimizer state and, by default, no weights: it cannot be trained
further, sampled, fine-tuned from, or evaluated with settings other than those it was
archived with; each of those says so (``record_advice``) instead of failing on a missing file.

A grid that other grids start from (``archive_weights: true``: parents that fine-tunes load
with ``init.run``) keeps the final checkpoint's weights as well (checkpoints/step_N/
model.safetensors, as trained, in fp32): such a record can be fine-tuned from, sampled and
evaluated anew, but still not trained further. The weights cost the repository their size
(4 bytes a parameter; safetensors does not compress), so only grids others need keep them.

The large text files are gzipped (deterministically: the same run gives the same bytes), so a
record without weights costs the repository, and every copy of the working tree, a few
hundred KB; they are unpacked when the record is restored.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Iterable

from ropelab.common.atomic import atomic_directory, write_bytes_atomic
from ropelab.common.errors import CheckpointError
from ropelab.training.run_dir import META, METRICS, TOKENIZER, WEIGHTS, RunDir

RECORD = "record.json"
RECORD_FORMAT = 1  # "weights": true, in a record that keeps them, does not change the format
HOLDS = ("config, tokenizer, metrics, the final checkpoint's metadata and the grid's evaluation caches; "
         "no weights or optimizer state")
HOLDS_WEIGHTS = ("config, tokenizer, metrics, the final checkpoint's metadata and weights and the grid's "
                 "evaluation caches; no optimizer state")


def record_file(run: RunDir) -> Path:
    return run.path / RECORD


def is_record(run: RunDir) -> bool:
    """Whether ``run`` is a record (restored from an archive, or the archive's own copy)."""
    return record_file(run).is_file()


def record_has_weights(run: RunDir) -> bool:
    """Whether the record ``run`` keeps its final weights (its grid's ``archive_weights``)."""
    try:
        return bool(json.loads(record_file(run).read_text()).get("weights", False))
    except (OSError, ValueError, AttributeError):
        return False  # unreadable: treated as the first records, which kept none


def record_advice(run: RunDir) -> str:
    again = ("To do that, train it again: remove the directory and its copy in the grid's archive, then run "
             "the grid again")
    if record_has_weights(run):
        return (f"{run} is a run record ({HOLDS_WEIGHTS}), restored from a grid's archive "
                "(training/run_record.py): it can be reported, evaluated, sampled and fine-tuned from (init.run), "
                f"but not trained further. {again}")
    return (f"{run} is a run record ({HOLDS}), restored from a grid's archive (training/run_record.py): "
            "its results can be reported with the evaluations it holds, but it cannot be trained further, "
            f"sampled, fine-tuned from or evaluated anew. {again}")


def check_not_record(run: RunDir) -> None:
    """Before training continues: raise a CheckpointError naming what a record is (none holds
    optimizer state, so none is trained further)."""
    if is_record(run):
        raise CheckpointError(record_advice(run))


def check_loadable(run: RunDir) -> None:
    """Before weights are loaded: raise a CheckpointError naming what a record is, unless it
    keeps its weights."""
    if is_record(run) and not record_has_weights(run):
        raise CheckpointError(record_advice(run))


def record_paths(run: RunDir, caches: Iterable[Path], weights: bool = False) -> list[Path]:
    """The files of ``run`` a record keeps (relative paths), given the evaluation caches to
    keep and whether it keeps the final weights; raises CheckpointError when the run has no
    complete checkpoint."""
    ckpt = run.latest_checkpoint()
    if ckpt is None:
        raise CheckpointError(f"{run} has no checkpoint: a run is archived once it has trained")
    wanted = [run.config, run.tokenizer, run.metrics, run.latest_pointer, ckpt / META, run.planned_eval, *caches,
              *([ckpt / WEIGHTS] if weights else [])]
    missing = [p for p in wanted if not p.is_file()]
    if missing:
        raise CheckpointError(f"{run} cannot be archived: {', '.join(str(p) for p in missing)} missing")
    return [p.relative_to(run.path) for p in wanted]


def packed(rel: Path) -> bool:
    """Whether a record keeps the file ``rel`` gzipped (the tokenizer, metrics and evaluation caches)."""
    return rel.name in (TOKENIZER, METRICS) or (rel.parts[0] == "eval" and rel.suffix == ".json")


def kept_as(rel: Path) -> Path:
    """Where a record keeps the run's file ``rel`` (relative paths): gzipped ones with ``.gz`` added."""
    return rel.with_name(rel.name + ".gz") if packed(rel) else rel


def write_record(run: RunDir, caches: Iterable[Path], dest: Path, weights: bool = False) -> None:
    """Copy ``run``'s record (with the evaluation caches ``caches``, and its final weights when
    ``weights``) to ``dest``, replacing an earlier record there in one rename."""
    paths = record_paths(run, caches, weights)
    checkpoint = run.latest_checkpoint().name
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(dest, replace=True) as tmp:
        for rel in paths:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            if packed(rel):
                data = gzip.compress((run.path / rel).read_bytes(), compresslevel=9, mtime=0)
                (tmp / kept_as(rel)).write_bytes(data)
            else:
                shutil.copyfile(run.path / rel, tmp / rel)
        about = {"format": RECORD_FORMAT, "checkpoint": checkpoint, "holds": HOLDS_WEIGHTS if weights else HOLDS,
                 **({"weights": True} if weights else {})}  # a record without weights: as the first ones were
        (tmp / RECORD).write_text(json.dumps(about, indent=1) + "\n")


def restore_record(src: Path, run: RunDir) -> None:
    """Copy the record ``src`` to the run directory ``run``, which must hold no checkpoint
    (a directory left by a run that never saved one is replaced)."""
    if not is_record(RunDir(src)):
        raise CheckpointError(f"{src} is not a run record (no {RECORD}); a grid's archive holds only the records "
                              "`ropelab ablate` writes: move it away")
    if run.path.exists() and run.latest_checkpoint() is not None:
        raise CheckpointError(f"{run} holds a run with checkpoints; it is not replaced by the record {src}")
    with atomic_directory(run.path, replace=True) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        for path in list(tmp.rglob("*.gz")):
            path.with_suffix("").write_bytes(_unpacked(path, src / path.relative_to(tmp)))
            path.unlink()


def _unpacked(path: Path, named: Path) -> bytes:
    """The gzipped record file ``path`` unpacked (``named``: the archive's file, for the message)."""
    try:
        data = gzip.decompress(path.read_bytes())
        if named.name.endswith(".json.gz"):  # whole gzip around text that is not JSON is as damaged as a cut one
            json.loads(data)
        return data
    except (OSError, EOFError, ValueError) as e:  # gzip.BadGzipFile is an OSError, a JSON or UTF-8 error a ValueError
        raise CheckpointError(f"{named} does not unpack ({e}); the record is damaged: restore it from git "
                              "(git checkout -- PATH), or remove it to train the run again") from None


def refresh_record(src: Path, run: RunDir) -> bool:
    """Bring the restored record ``run`` up to date with its archived copy ``src``, which may
    have changed in git since it was restored (an evaluation scored again from the weights the
    record was made from): every file whose content differs is written again, files the archive
    lacks (evaluations of a record that keeps weights) stay. Whether any file changed."""
    changed = []
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src)
        data, rel = (_unpacked(path, path), rel.with_suffix("")) if path.suffix == ".gz" else (path.read_bytes(), rel)
        target = run.path / rel
        if not target.is_file() or target.read_bytes() != data:
            changed.append((target, data))
    for target, data in changed:  # every file unpacked before any is written: a damaged record changes nothing
        target.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(target, data)
    return bool(changed)
