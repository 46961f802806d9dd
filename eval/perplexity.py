"""Perplexity of a model on a token split: pure functions ``(model, tokens, settings) -> results``.

Protocols (windows from ``data.samplers.eval_windows``):
- non-overlapping windows of the evaluation length — the default of Press et al. (2022,
  ALiBi), where early tokens of every window have little context;
- sliding windows with stride S, scoring only the last S targets of each window, so
  each scored token has at least L−S tokens of context (the "early token curse" of
  non-overlapping evaluation avoided; Press et al. 2021, "Shortformer", §2.2).

Reported: mean token NLL (nats), perplexity exp(NLL), bits per byte
(NLL_total / ln 2 / UTF-8 bytes of the scored tokens, comparable across tokenizers), and
the number of tokens scored. Batches shrink with the length (``max_batch_tokens``) so
long evaluations keep memory bounded.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from data.samplers import EvalWindow, eval_windows, window_batch
from model.loss import perplexity_of


@dataclass
class Perplexity:
    length: int
    protocol: str  # "nonoverlap" or "sliding"
    stride: int
    nll: float  # mean negative log-likelihood per scored token, nats
    ppl: float
    bpb: Optional[float]  # bits per UTF-8 byte of the scored text (None without byte counts)
    tokens: int  # targets scored
    windows: int

    def to_dict(self) -> dict:
        return asdict(self)


def _batches(windows: Sequence[EvalWindow], length: int, batch_size: int,
             max_batch_tokens: int) -> Iterator[list[EvalWindow]]:
    size = max(1, min(batch_size, max_batch_tokens // length))
    for i in range(0, len(windows), size):
        yield list(windows[i:i + size])


@torch.no_grad()
def window_losses(model, tokens: np.ndarray, windows: Sequence[EvalWindow], batch_size: int = 8,
                  max_batch_tokens: int = 16384) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per-target NLL for each batch of windows: yields (nll (B, T), targets (B, T), score mask (B, T))."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        for group in _batches(windows, windows[0].length, batch_size, max_batch_tokens):
            x, y, mask = window_batch(tokens, group)
            # Per-target NLL (B, T) straight from the model: the logits are never all held.
            nll = model(x.to(device), targets=y.to(device), reduction="none")
            yield nll.cpu(), y, mask
    finally:
        model.train(was_training)


def validation_loss(model, tokens: np.ndarray, length: int, batch_size: int,
                    max_windows: Optional[int] = None) -> float:
    """Mean NLL over the first ``max_windows`` non-overlapping windows (the training-time check)."""
    windows = eval_windows(len(tokens), length, max_windows=max_windows)
    total, count = 0.0, 0
    for nll, _, mask in window_losses(model, tokens, windows, batch_size):
        total += float(nll[mask].double().sum())
        count += int(mask.sum())
    return total / count


def perplexity(model, tokens: np.ndarray, length: int, *, stride: Optional[int] = None,
               batch_size: int = 8, max_tokens: Optional[int] = None,
               token_bytes: Optional[np.ndarray] = None, max_batch_tokens: int = 16384) -> Perplexity:
    """Perplexity at ``length``: non-overlapping windows (``stride`` None or = length) or sliding.

    ``token_bytes[id]`` is the UTF-8 byte length of token ``id`` (for bits per byte).
    """
    stride = length if stride is None else stride
    windows = eval_windows(len(tokens), length, stride=stride, max_tokens=max_tokens)
    total, count, n_bytes = 0.0, 0, 0
    lengths = torch.from_numpy(token_bytes.astype(np.int64)) if token_bytes is not None else None
    for nll, y, mask in window_losses(model, tokens, windows, batch_size, max_batch_tokens):
        total += float(nll[mask].double().sum())
        count += int(mask.sum())
        if lengths is not None:
            n_bytes += int(lengths[y[mask]].sum())
    nll = total / count
    bpb = total / math.log(2) / n_bytes if n_bytes else None
    return Perplexity(length=length, protocol="nonoverlap" if stride == length else "sliding",
                      stride=stride, nll=nll, ppl=perplexity_of(nll), bpb=bpb, tokens=count,
                      windows=len(windows))


def per_position_loss(model, tokens: np.ndarray, length: int, *, batch_size: int = 8,
                      max_windows: Optional[int] = None, max_batch_tokens: int = 16384) -> np.ndarray:
    """Mean NLL at each position 0 … length-1 over non-overlapping windows, float64 (length,)."""
    windows = eval_windows(len(tokens), length, max_windows=max_windows)
    sums = torch.zeros(length, dtype=torch.float64)
    for nll, _, _ in window_losses(model, tokens, windows, batch_size, max_batch_tokens):
        sums += nll.double().sum(dim=0)
    return (sums / len(windows)).numpy()
