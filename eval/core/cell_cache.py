"""Scored evaluation cells by content, shared by the runs of one directory.

A cell's perplexities depend only on the weights, the model config it runs with (its RoPE
scaling included), the scored tokens and the scoring settings. Keyed by a digest of
exactly those, a cell is scored once for every evaluation that needs it:

- step 0 of fine-tunes that start from the same parent (every seed of a method, eval.steps);
- a finished run evaluated again with one more length, corpus or scaling: the evaluation
  config is new, so the run's own cache (eval/lm/extrapolation.py) misses, but every cell
  scored before comes from here and only the new ones are computed.

Cells are JSON files under ``.eval-cells/`` in the runs' parent directory (a grid's
directory, or ``runs/``), written atomically, so two jobs of a grid can share it. A file
that cannot be read is a miss and is scored again. Delete the directory to start afresh.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ropelab.common.atomic import write_text_atomic

STORE_DIR = ".eval-cells"


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every tensor of the state dict (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # 1-D: a 0-dim view cannot change dtype
    return h.hexdigest()


def tokens_digest(tokens: np.ndarray, token_bytes: Optional[np.ndarray], eot_id: Optional[int],
                  within_document: bool) -> str:
    """SHA-256 of what a cell scores: the tokens, their byte lengths and the document rule."""
    h = hashlib.sha256(f"{tokens.dtype}|{eot_id}|{within_document}|".encode())
    h.update(np.ascontiguousarray(tokens).tobytes())
    if token_bytes is not None:
        h.update(np.ascontiguousarray(token_bytes).tobytes())
    return h.hexdigest()


def address(content: dict) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()


class CellStore:
    """Cells by address: {"results": one dict per protocol, "curve": dict or None}."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def get(self, key: str) -> Optional[dict]:
        path = self.root / f"{key}.json"
        try:
            cell = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return cell if isinstance(cell, dict) and isinstance(cell.get("results"), list) else None

    def put(self, key: str, results: list[dict], curve: Optional[dict]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.root / f"{key}.json", json.dumps({"results": results, "curve": curve}))
