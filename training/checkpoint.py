"""Checkpoints in a run directory: atomic, safe to load, free of wrapper prefixes.

Where they live is training/run_dir.py's business. A checkpoint directory is written
whole and renamed into place (common/atomic.py); ``latest`` is replaced atomically
afterwards, so a crash at any moment leaves the previous checkpoint and pointer intact.
Weights are safetensors, and meta.json records the sha256 of their file (``weights_sha256``):
a weights file replaced after training (another run's, of the same shapes, loads without
a murmur) or altered on disk is found on load and treated as a damaged checkpoint. Weights (no code runs on load; older layouts are converted, see
``load_weights``); training state is loaded with
``torch.load(weights_only=True)``. Models are always unwrapped from DDP and torch.compile
first, so keys never carry ``module.`` or ``_orig_mod.`` and a compiled run resumes
uncompiled and vice versa.

Loading never needs a person to delete anything: ``load_newest`` tries the newest
checkpoint and, when its files are truncated or corrupt (``UnreadableCheckpoint``), the
next older one, saying which it skipped. A full disk while saving leaves no partial
checkpoint and the previous one in place, and is reported as a ``StorageError``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Collection, Optional, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model
from torch import nn

from ropelab.common.atomic import atomic_directory, write_text_atomic
from ropelab.common.storage import CONTINUE_RUN, RecordingWriter, os_error_in, storage_error
from ropelab.common.errors import CheckpointError
from ropelab.common.logs import get_logger
from ropelab.model.layers import fuse_projections
from ropelab.training.run_dir import META, STATE, WEIGHTS, RunDir

logger = get_logger(__name__)

FORMAT = "ropelab-checkpoint/1"
WEIGHTS_KEY = "weights_sha256"  # meta.json: the sha256 of the weights file as saved
T = TypeVar("T")


class UnreadableCheckpoint(CheckpointError):
    """A checkpoint's files are missing, truncated or corrupt: an older one can stand in."""


class NonFiniteWeights(CheckpointError):
    """A checkpoint whose weights hold NaN or infinite values: nothing computed from it means
    anything. Callers that know the run add what to do (training/nonfinite.py)."""

    def __init__(self, path: Path, bad: dict[str, int]):
        self.path, self.bad = path, bad
        names = ", ".join(sorted(bad)[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        super().__init__(f"{path} holds non-finite weights ({sum(bad.values()):,} NaN or infinite values, in {names})")


def non_finite(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Name -> count of NaN or infinite values, for the floating-point tensors that have any."""
    counts = {name: int((~torch.isfinite(t)).sum()) for name, t in tensors.items() if t.is_floating_point()}
    return {name: n for name, n in counts.items() if n}


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def _write_dir(final: Path, model: nn.Module, state: Optional[dict], meta: dict) -> None:
    writer = None
    try:
        with atomic_directory(final, replace=True) as tmp:
            save_model(unwrap(model), str(tmp / WEIGHTS))
            meta = {**meta, WEIGHTS_KEY: file_sha256(tmp / WEIGHTS)}
            if state is not None:
                with open(tmp / STATE, "wb") as f:
                    writer = RecordingWriter(f)
                    torch.save(state, writer)
            (tmp / META).write_text(json.dumps({"format": FORMAT, **meta}, indent=2))
    except (OSError, RuntimeError, SafetensorError) as e:
        # torch.save and safetensors report a full disk as errors of their own.
        cause = (writer.error if writer is not None else None) or os_error_in(e)
        if cause is None:
            raise
        raise storage_error(cause, f"write the checkpoint {final}", final.parent, CONTINUE_RUN) from None


def save_checkpoint(run: RunDir, step: int, model: nn.Module, state: Optional[dict], meta: dict,
                    keep_last: int, pinned: Collection[int] = ()) -> Path:
    """Write the step's checkpoint atomically, point ``latest`` at it, prune to ``keep_last``.

    Only checkpoints up to this step count for pruning: one from beyond it can only be
    left from a session that was rolled back, and must not push out an earlier good one.
    The steps in ``pinned`` are never pruned and do not count towards ``keep_last``.
    """
    final = run.step_dir(step)
    _write_dir(final, model, state, {"step": step, **meta})
    write_text_atomic(run.latest_pointer, final.name)
    kept_always = {run.step_dir(s).name for s in pinned}
    kept = [p for p in run.complete_checkpoints() if p.name <= final.name and p.name not in kept_always]
    for old in kept[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_best(run: RunDir, model: nn.Module, meta: dict) -> None:
    _write_dir(run.best, model, None, meta)


def read_meta(ckpt: Path) -> dict:
    try:
        meta = json.loads((ckpt / META).read_text())
    except (OSError, ValueError) as e:
        raise UnreadableCheckpoint(f"{ckpt} is not a readable ropelab checkpoint ({META}: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise UnreadableCheckpoint(f"{ckpt} is not a ropelab checkpoint (format {found!r}, expected {FORMAT!r})")
    return meta


def load_weights(model: nn.Module, ckpt: Path) -> None:
    """Load ``ckpt``'s weights into ``model`` strictly, with clear errors.

    Checkpoints written before q/k/v and gate/up were fused are converted on load
    (model/layers.py). Tied weights are stored once: a group of names sharing one tensor
    is complete when any of its names was loaded. Weights with NaN or infinite values are
    refused (``NonFiniteWeights``) before anything is loaded.
    """
    path = ckpt / WEIGHTS
    tensors = read_weights(ckpt)
    bad = non_finite(tensors)
    if bad:
        raise NonFiniteWeights(path, bad)
    target = unwrap(model)
    try:
        missing, unexpected = target.load_state_dict(tensors, strict=False)
    except RuntimeError as e:
        raise CheckpointError(f"{path} does not fit this model (shapes differ: {str(e).splitlines()[-1].strip()}); "
                              "it was saved from a model with another config") from None
    missing = _not_loaded_through_a_tied_name(target, set(missing))
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit this model: missing {sorted(missing)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]}; it was saved from another config")


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _recorded_digest(ckpt: Path) -> Optional[str]:
    """The weights digest ``ckpt``'s meta.json recorded; None when it has none (written
    before digests were recorded, or no meta.json: its readers say so)."""
    try:
        meta = json.loads((ckpt / META).read_text())
    except (OSError, ValueError):
        return None
    return meta.get(WEIGHTS_KEY) if isinstance(meta, dict) else None


def read_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """``ckpt``'s weights by name (fused layout), or UnreadableCheckpoint, also when the file
    is not the one the checkpoint saved (its digest differs from meta.json's)."""
    path = ckpt / WEIGHTS
    if not path.exists():
        raise UnreadableCheckpoint(f"no weights at {path}")
    try:
        tensors = load_file(str(path))
        recorded = _recorded_digest(ckpt)
        found = file_sha256(path) if recorded is not None else None
    except (SafetensorError, OSError, ValueError) as e:
        raise UnreadableCheckpoint(f"cannot read {path}: the file is truncated or corrupt ({e})") from None
    if found != recorded:
        raise UnreadableCheckpoint(f"{path} is not the file {ckpt.name} saved (its sha256 is {found[:12]}…, "
                                   f"meta.json recorded {recorded[:12]}…): it was replaced or altered after "
                                   "training; put the original file back")
    return fuse_projections(tensors)


def _not_loaded_through_a_tied_name(model: nn.Module, missing: set[str]) -> set[str]:
    names_of: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), set()).add(name)
    return {name for name in missing
            if not any(names - missing for names in names_of.values() if name in names)}


def load_state(ckpt: Path) -> dict[str, Any]:
    """Training state saved by ``save_checkpoint``; no pickled code is executed."""
    path = ckpt / STATE
    try:
        with open(path, "rb") as f:
            return torch.load(f, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UnreadableCheckpoint(f"{path} is missing; the checkpoint is incomplete") from None
    except Exception as e:  # truncated zip, foreign pickle with code, ...
        raise UnreadableCheckpoint(f"cannot load {path}: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0][:200]}") from None


# What to do when no checkpoint of a run reads, as train.py --resume meets it.
RETRAIN_ON_RESUME = ("To train this run again from step 0, move the directory aside (e.g. mv {run} {run}.damaged) "
                     "and run the same command without --resume.")


def load_newest(run: RunDir, load: Callable[[Path], T],
                advice: Optional[str] = None) -> Optional[tuple[Path, T, list[Path]]]:
    """``(checkpoint, load(checkpoint), skipped)`` for the newest checkpoint whose files read.

    When ``load`` finds a checkpoint unreadable, the next older one is tried, and a warning
    says so; ``skipped`` lists the unreadable ones. None when the run has no checkpoint;
    a CheckpointError when none of them reads, ending with ``advice`` (by default
    ``RETRAIN_ON_RESUME``), which must work for the command that meets it.
    """
    candidates = run.checkpoint_candidates()
    named = run.pointer_target()
    if candidates and named is not None and candidates[0].name != named:
        logger.warning(f"warning: {run.latest_pointer} names {named}, which is not a complete checkpoint; "
                       f"using the newest one there is, {candidates[0].name}")
    elif candidates and named is None:
        logger.warning(f"warning: {run.latest_pointer} is missing; using the newest checkpoint there is, "
                       f"{candidates[0].name}")
    skipped: list[Path] = []
    reasons: list[str] = []
    for ckpt in candidates:
        try:
            result = load(ckpt)
        except UnreadableCheckpoint as e:
            skipped.append(ckpt)
            reasons.append(str(e))
            logger.warning(f"warning: {e}; falling back to an earlier checkpoint")
            continue
        if skipped:
            logger.warning(f"note: using {ckpt.name}, the newest checkpoint of {run} that reads")
        return ckpt, result, skipped
    if not candidates:
        return None
    raise CheckpointError(f"no checkpoint of {run} can be read:\n  " + "\n  ".join(reasons) +
                          "\nNothing was changed. " + (advice or RETRAIN_ON_RESUME.format(run=run)))


def set_aside(run: RunDir, ckpt: Path) -> None:
    """Rename an unreadable checkpoint out of the way (kept for inspection, never loaded or
    pruned), so that training can write that step again."""
    target = run.unreadable(ckpt)
    if target.exists():
        shutil.rmtree(target)  # an older copy of the same damaged step
    ckpt.rename(target)
    logger.warning(f"note: moved the unreadable {ckpt.name} to {target}; delete it once you no longer need it")
