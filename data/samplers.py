"""Training batches (seeded random windows) and evaluation windows (deterministic).

Training: each batch is ``B`` windows of ``seq_len + 1`` tokens at random offsets into the
flat train split; ``x`` is a window's first ``seq_len`` tokens, ``y`` the same shifted by
one. Batch ``k`` is a pure function of ``(seed, k)``: one RNG draws the *global* batch
(``batch_size * world_size`` offsets) and rank ``r`` keeps its slice, so a 2-rank run with
batch ``b`` sees exactly the batches of a 1-rank run with batch ``2b``, and the sampler's
state is just the counter ``k``.

Randomized positions (optional, ``train.random_positions``): ``RandomPositions.batch(k)``
gives each sequence of batch ``k`` a sorted random subset of [0, max_len) as positions,
again a pure function of ``(seed, k)`` with the same global-batch/rank split, so a resumed
run draws exactly the positions of an uninterrupted one.

Evaluation: contiguous windows over a split, either non-overlapping or sliding; each
window says which of its targets to score so no target is scored twice. Windows run over
the whole split as one stream (as in the ALiBi paper's evaluation), or inside each
document only (``document_windows``), the way long-context papers evaluate on books. The
same-token protocol (``target_windows``) scores one fixed set of target spans at every
length, so lengths differ only in how much context precedes the scored tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ropelab.common.errors import DataError


class TrainSampler:
    """Seeded, rank-aware random windows; ``state_dict`` holds plain ints only."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        if len(tokens) < seq_len + 1:
            raise DataError(f"the training split has {len(tokens)} tokens, fewer than one "
                            f"window of train.seq_len + 1 = {seq_len + 1}; use more text or a "
                            "shorter train.seq_len")
        self.tokens, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.batches_drawn = 0

    def offsets(self, k: int) -> np.ndarray:
        """This rank's window starts in global batch ``k``."""
        rng = np.random.default_rng([self.seed, k])
        high = len(self.tokens) - self.seq_len  # last valid start is len - (seq_len + 1)
        starts = rng.integers(0, high, size=self.batch_size * self.world_size)
        return starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), int64 tensors of shape (B, T)."""
        starts = self.offsets(self.batches_drawn)
        self.batches_drawn += 1
        windows = np.stack([self.tokens[s:s + self.seq_len + 1] for s in starts]).astype(np.int64)
        batch = torch.from_numpy(windows)  # (B, T + 1)
        return batch[:, :-1], batch[:, 1:]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "batches_drawn": self.batches_drawn}

    def load_state_dict(self, state: dict) -> None:
        self.seed = int(state["seed"])
        self.batches_drawn = int(state["batches_drawn"])


class RandomPositions:
    """Sorted random subsets of [0, max_len) of size seq_len, one per training sequence
    (Ruoss et al. 2023). Stateless: batch ``k``'s positions depend on ``(seed, k)`` only,
    drawn from an RNG stream separate from the window offsets'."""

    STREAM = 1  # appended to (seed, k) so these draws never repeat the offsets' stream

    def __init__(self, max_len: int, seq_len: int, batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        if max_len < seq_len:
            raise ValueError(f"cannot draw {seq_len} distinct positions from [0, {max_len})")
        self.max_len, self.seq_len, self.batch_size = max_len, seq_len, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size

    def batch(self, k: int) -> torch.Tensor:
        """This rank's positions for global batch ``k``: int64 (B, T), ascending per row."""
        rng = np.random.default_rng([self.seed, k, self.STREAM])
        first = self.rank * self.batch_size
        rows = [np.sort(rng.choice(self.max_len, size=self.seq_len, replace=False))
                for _ in range(first + self.batch_size)][first:]  # every rank draws the same global batch
        return torch.from_numpy(np.stack(rows).astype(np.int64))


@dataclass(frozen=True)
class EvalWindow:
    """Inputs ``tokens[start : start + length]``, targets shifted by one; targets at
    window positions ``score_from ..`` are scored."""

    start: int
    length: int
    score_from: int = 0

    @property
    def scored(self) -> int:
        return self.length - self.score_from


def eval_windows(n_tokens: int, length: int, stride: Optional[int] = None,
                 max_windows: Optional[int] = None, offset: int = 0) -> list[EvalWindow]:
    """Deterministic windows over a split of ``n_tokens`` tokens (``n_tokens - 1`` targets).

    ``stride=None`` (or ``= length``): non-overlapping windows, ``(n_tokens - 1) // length``
    of them, every target scored; the remainder shorter than a window is dropped.
    ``stride < length``: sliding windows ``stride`` apart, each scoring only its last
    ``stride`` targets, and a last window aligned to the end of the split scores whatever
    is left. Every scored target therefore has at least ``length - stride`` tokens of
    context — the first window's early targets too, which is why the first
    ``length - stride`` targets of the split are not scored — and every later target is
    scored exactly once. With ``stride = length`` this is the non-overlapping protocol.
    ``max_windows`` keeps a prefix (the training-time validation); ``offset`` shifts every
    window, for a stretch of tokens that starts inside a longer split.
    """
    if length < 1 or (stride is not None and not 1 <= stride <= length):
        raise ValueError(f"need length >= 1 and 1 <= stride <= length (got {length}, {stride})")
    if n_tokens - 1 < length:
        raise DataError(f"the evaluation split has {n_tokens} tokens, too few for one window of "
                        f"length {length} (which needs {length + 1}); evaluate shorter lengths "
                        "or use a larger split")
    stride = length if stride is None else stride
    last_start = n_tokens - 1 - length
    windows = [EvalWindow(offset + s, length, length - stride) for s in range(0, last_start + 1, stride)]
    covered = windows[-1].start - offset + length  # targets 1..covered are scored
    if stride < length and covered < n_tokens - 1:
        windows.append(EvalWindow(offset + last_start, length, length - (n_tokens - 1 - covered)))
    return windows[:max_windows] if max_windows is not None else windows


def document_spans(tokens: np.ndarray, eot_id: int) -> list[tuple[int, int]]:
    """(start, end) per document: ``tokens[start:end]`` is its text and ``tokens[end]`` its
    end-of-text token (``end`` = len(tokens) - 1 for a last document without one)."""
    ends = np.flatnonzero(np.asarray(tokens) == eot_id)
    if len(ends) == 0 or ends[-1] != len(tokens) - 1:
        ends = np.append(ends, len(tokens) - 1)
    starts = np.concatenate(([0], ends[:-1] + 1))
    return [(int(a), int(b)) for a, b in zip(starts, ends) if b > a]


def document_windows(spans: list[tuple[int, int]], length: int,
                     stride: Optional[int] = None) -> tuple[list[EvalWindow], int]:
    """Windows that never cross a document boundary, and how many documents were too short.

    A document's inputs and targets are its tokens through its end-of-text token, so its
    last target is the end of the document; documents with fewer than ``length + 1`` such
    tokens cannot hold one window and are skipped (and counted).
    """
    windows, skipped = [], 0
    for start, end in spans:
        n = end - start + 1
        if n - 1 < length:
            skipped += 1
            continue
        windows.extend(eval_windows(n, length, stride, offset=start))
    return windows, skipped


def target_windows(regions: list[tuple[int, int]], length: int, target: int,
                   longest: int) -> tuple[list[EvalWindow], int]:
    """Windows of ``length`` tokens that each score the same ``target`` tokens whatever the
    length (the same-token protocol), and how many regions were too short.

    A region ``(start, end)`` is a stretch whose inputs and targets are ``tokens[start:end + 1]``
    (the whole split, or one document through its end-of-text token). Target spans of
    ``target`` tokens tile its tail, ending at ``start + longest``, ``+ target``, … ≤ ``end``,
    so the window of the ``longest`` length before each span still lies inside the region;
    the window of ``length`` ends where the span ends and scores its last ``target``
    targets. Every length thus scores exactly the same targets and only the context before
    them changes. Regions with fewer than ``longest + 1`` tokens hold no span (counted).
    """
    if not 1 <= target <= length <= longest:
        raise ValueError(f"need 1 <= target <= length <= longest (got {target}, {length}, {longest})")
    windows, skipped = [], 0
    for start, end in regions:
        ends = range(start + longest, end + 1, target)
        if not ends:
            skipped += 1
        windows.extend(EvalWindow(e - length, length, length - target) for e in ends)
    return windows, skipped


def spread_windows(windows: list[EvalWindow], max_tokens: Optional[int]) -> list[EvalWindow]:
    """The fewest evenly spaced windows (first and last included) scoring ``max_tokens``.

    Evenly spaced over the whole split rather than a prefix, so a budget covers every part
    of the corpus (and far more documents, which the bootstrap resamples). Deterministic,
    so every run is scored on the same tokens. All windows when they score fewer.
    """
    total = sum(w.scored for w in windows)
    if max_tokens is None or total <= max_tokens:
        return windows
    count = max(1, math.ceil(max_tokens * len(windows) / total))
    while True:
        picked = np.unique(np.round(np.linspace(0, len(windows) - 1, count)).astype(np.int64))
        chosen = [windows[i] for i in picked]
        if sum(w.scored for w in chosen) >= max_tokens or count >= len(windows):
            return chosen
        count += 1


def window_batch(tokens: np.ndarray,
                 windows: list[EvalWindow]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, score_mask) for windows of equal length: int64 (B, T), int64 (B, T), bool (B, T)."""
    length = windows[0].length
    if any(w.length != length for w in windows):
        raise ValueError("window_batch needs windows of one length")
    rows = np.stack([tokens[w.start:w.start + length + 1] for w in windows]).astype(np.int64)
    batch = torch.from_numpy(rows)  # (B, T + 1)
    mask = torch.zeros(len(windows), length, dtype=torch.bool)
    for i, w in enumerate(windows):
        mask[i, w.score_from:] = True
    return batch[:, :-1], batch[:, 1:], mask
