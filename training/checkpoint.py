"""Checkpoints in a run directory: atomic, safe to load, free of wrapper prefixes.

Where they live is training/run_dir.py's business. A checkpoint directory is written
whole and renamed into place (data/atomic.py); ``latest`` is replaced atomically
afterwards, so a crash at any moment leaves the previous checkpoint and pointer intact.
Weights are safetensors (no code runs on load; older layouts are converted, see
``load_weights``); training state is loaded with
``torch.load(weights_only=True)``. Models are always unwrapped from DDP and torch.compile
first, so keys never carry ``module.`` or ``_orig_mod.`` and a compiled run resumes
uncompiled and vice versa.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model
from torch import nn

from data.atomic import atomic_directory, write_text_atomic
from model.errors import CheckpointError
from model.layers import fuse_projections
from training.run_dir import META, STATE, WEIGHTS, RunDir

FORMAT = "ropelab-checkpoint/1"


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
    with atomic_directory(final, replace=True) as tmp:
        save_model(unwrap(model), str(tmp / WEIGHTS))
        if state is not None:
            with open(tmp / STATE, "wb") as f:
                torch.save(state, f)
        (tmp / META).write_text(json.dumps({"format": FORMAT, **meta}, indent=2))


def save_checkpoint(run: RunDir, step: int, model: nn.Module, state: Optional[dict], meta: dict,
                    keep_last: int) -> Path:
    """Write the step's checkpoint atomically, point ``latest`` at it, prune to ``keep_last``."""
    final = run.step_dir(step)
    _write_dir(final, model, state, {"step": step, **meta})
    write_text_atomic(run.latest_pointer, final.name)
    for old in run.complete_checkpoints()[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_best(run: RunDir, model: nn.Module, meta: dict) -> None:
    _write_dir(run.best, model, None, meta)


def read_meta(ckpt: Path) -> dict:
    try:
        meta = json.loads((ckpt / META).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt} is not a readable ropelab checkpoint ({META}: {e}); "
                              "delete it to fall back to an earlier one") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{ckpt} is not a ropelab checkpoint (format {meta.get('format')!r}, "
                              f"expected {FORMAT!r})")
    return meta


def load_weights(model: nn.Module, ckpt: Path) -> None:
    """Load ``ckpt``'s weights into ``model`` strictly, with clear errors.

    Checkpoints written before q/k/v and gate/up were fused are converted on load
    (model/layers.py). Tied weights are stored once: a group of names sharing one tensor
    is complete when any of its names was loaded.
    """
    path = ckpt / WEIGHTS
    if not path.exists():
        raise CheckpointError(f"no weights at {path}")
    try:
        tensors = fuse_projections(load_file(str(path)))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: the file is truncated or corrupt ({e}). "
                              "Delete this checkpoint to fall back to an earlier one.") from None
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
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete — delete "
                              f"{ckpt} to fall back to an earlier one") from None
    except Exception as e:  # truncated zip, foreign pickle with code, ...
        raise CheckpointError(f"cannot load {path}: {type(e).__name__}: {str(e).splitlines()[0][:200]}. "
                              f"Delete {ckpt} to fall back to an earlier checkpoint.") from None
