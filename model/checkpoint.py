"""Checkpoints in a run directory: atomic, safe to load, free of wrapper prefixes.

Layout of ``runs/<name>/``::

    config.yaml  tokenizer.json  metrics.jsonl
    checkpoints/step_000200/{model.safetensors, state.pt, meta.json}
    checkpoints/latest            # name of the newest complete checkpoint
    best/{model.safetensors, meta.json}

A checkpoint is written into a temporary directory, flushed to disk and renamed into
place; ``latest`` is replaced atomically afterwards. A crash at any moment leaves the
previous checkpoint and pointer intact. Weights are safetensors (no code runs on load);
training state is loaded with ``torch.load(weights_only=True)``. Models are always
unwrapped from DDP and torch.compile first, so keys never carry ``module.`` or
``_orig_mod.`` and a compiled run resumes uncompiled and vice versa.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from model.errors import CheckpointError

FORMAT = "ropelab-checkpoint/1"
WEIGHTS, STATE, META = "model.safetensors", "state.pt", "meta.json"


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so readers see the old or the new file, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_dir(final: Path, model: nn.Module, state: Optional[dict], meta: dict) -> None:
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(unwrap(model), str(tmp / WEIGHTS))
    if state is not None:
        with open(tmp / STATE, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    write_atomic(tmp / META, json.dumps({"format": FORMAT, **meta}, indent=2))
    _fsync_dir(tmp)
    old = final.with_name(f".old-{final.name}-{os.getpid()}")
    if final.exists():  # e.g. best/ being replaced: move aside, then swap in
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(final.parent)


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, state: dict, meta: dict,
                    keep_last: int) -> Path:
    """Write checkpoints/step_N atomically, point ``latest`` at it, prune to ``keep_last``."""
    ckpt_root = run_dir / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step:06d}"
    _write_dir(final, model, state, {"step": step, **meta})
    write_atomic(ckpt_root / "latest", final.name)
    complete = sorted(p for p in ckpt_root.glob("step_*") if (p / META).exists())
    for old in complete[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_best(run_dir: Path, model: nn.Module, meta: dict) -> None:
    _write_dir(run_dir / "best", model, None, meta)


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    """The checkpoint ``latest`` names, or None when the run has none yet."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    if not path.is_dir():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist; delete {pointer} "
                              "to start over or restore the checkpoint directory")
    return path


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
    """Load ``ckpt/model.safetensors`` into ``model`` strictly, with clear errors."""
    path = ckpt / WEIGHTS
    if not path.exists():
        raise CheckpointError(f"no weights at {path}")
    try:
        missing, unexpected = load_model(unwrap(model), str(path), strict=False)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: the file is truncated or corrupt ({e}). "
                              "Delete this checkpoint to fall back to an earlier one.") from None
    except RuntimeError as e:
        raise CheckpointError(f"{path} does not fit this model (shapes differ: {str(e).splitlines()[0]}); "
                              "it was saved from a model with another config") from None
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit this model: missing {sorted(missing)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]}; it was saved from another config")


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
