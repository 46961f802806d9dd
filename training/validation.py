"""A model's loss on held-out data: what the trainer logs as ``val_loss``.

- text: ``validation_loss``, the mean NLL over the first non-overlapping windows of a split;
- synthetic tasks: ``answer_loss``, the mean NLL over the answer targets of fixed batches.

``window_losses`` (per-target NLL of a batch of windows) is also what eval/lm/perplexity.py's
protocols score, so training-time and evaluation-time losses are one computation.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import torch

from ropelab.data.samplers import EvalWindow, eval_windows, window_batch
from ropelab.model.loss import IGNORE_INDEX


MAX_BATCH_TOKENS = 16384  # tokens per forward: fewer windows per batch as the length grows


def windows_per_batch(length: int, batch_size: int, max_batch_tokens: int = MAX_BATCH_TOKENS) -> int:
    """Windows of ``length`` tokens scored in one forward."""
    return max(1, min(batch_size, max_batch_tokens // length))


def _window_groups(windows: Sequence[EvalWindow], length: int, batch_size: int,
                   max_batch_tokens: int) -> Iterator[list[EvalWindow]]:
    size = windows_per_batch(length, batch_size, max_batch_tokens)
    for i in range(0, len(windows), size):
        yield list(windows[i:i + size])


@torch.no_grad()
def window_losses(model, tokens: np.ndarray, windows: Sequence[EvalWindow], batch_size: int = 8,
                  max_batch_tokens: int = MAX_BATCH_TOKENS
                  ) -> Iterator[tuple[list[EvalWindow], torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per batch of windows: (windows, NLL (B, T), targets (B, T), score mask (B, T))."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        for group in _window_groups(windows, windows[0].length, batch_size, max_batch_tokens):
            x, y, mask = window_batch(tokens, group)
            # Per-target NLL (B, T) straight from the model: the logits are never all held,
            # and positions that no window of the batch scores (context only) skip the head.
            first = min(w.score_from for w in group)
            skip = {"first_target": first} if first else {}
            nll = model(x.to(device), targets=y.to(device), reduction="none", **skip)
            yield group, nll.float().cpu(), y, mask
    finally:
        model.train(was_training)


def validation_loss(model, tokens: np.ndarray, length: int, batch_size: int,
                    max_windows: Optional[int] = None) -> float:
    """Mean NLL over the first ``max_windows`` non-overlapping windows (the training-time check)."""
    windows = eval_windows(len(tokens), length, max_windows=max_windows)
    total, count = 0.0, 0
    for _, nll, _, mask in window_losses(model, tokens, windows, batch_size):
        total += float(nll[mask].double().sum())
        count += int(mask.sum())
    return total / count


@torch.no_grad()
def answer_loss(model, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean NLL over the answer targets of (x, y) batches (other targets are IGNORE_INDEX)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    try:
        for x, y in batches:
            nll = model(x.to(device), targets=y.to(device), reduction="none")  # 0 where ignored
            total += float(nll.double().sum())
            count += int((y != IGNORE_INDEX).sum())
    finally:
        model.train(was_training)
    return total / count
