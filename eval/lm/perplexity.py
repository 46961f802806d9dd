"""Perplexity of a model on a token stream, with what the statistics need.

Protocols (windows from data/samplers.py, scored by training/validation.py's
``window_losses``, the computation the trainer's validation loss uses too):
- non-overlapping windows of the evaluation length — the default of Press et al. (2022,
  ALiBi), where early tokens of every window have little context;
- sliding windows with stride S, scoring only the last S targets of each window, so
  each scored token has at least L−S tokens of context (the "early token curse" of
  non-overlapping evaluation avoided; Press et al. 2021, "Shortformer", §2.2);
- the same target tokens at every length (``target=(T, longest)``): fixed spans of T
  targets, each scored from a window of the evaluated length that ends with it, so a
  longer length only adds context before the same tokens (data/samplers.py:
  ``target_windows``); the two other protocols score different tokens at each length.
Windows run over the split as one stream or inside documents only (``within_document``);
a token budget keeps windows spread evenly over the whole split.

Reported: mean token NLL (nats), perplexity exp(NLL), bits per byte (NLL_total / ln 2 /
UTF-8 bytes of the scored tokens, comparable across tokenizers), tokens, windows and
documents scored. For the intervals (eval/reporting/stats.py) the NLL, token and byte sums are kept
per *unit*: the documents the scored tokens belong to (grouped into at most MAX_UNITS
runs of consecutive documents), however few — five books are five units, since windows
of one book are not independent draws — or, where a single document is scored (a
stream without end-of-text tokens), contiguous blocks of windows, which the reports then
say are not independent. Optionally the loss by position
(non-overlapping windows), log-binned, with each bin's mean and spread over windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from ropelab.data.samplers import EvalWindow, document_spans, document_windows, eval_windows, spread_windows, target_windows
from ropelab.common.errors import DataError
from ropelab.model.loss import perplexity_of
from ropelab.training.validation import window_losses

MIN_DOCUMENTS = 2  # fewer scored documents than this (one): blocks of windows instead
MAX_UNITS = 100  # documents beyond this are grouped (consecutive) so results stay small
BLOCKS = 50  # blocks of consecutive windows when a single document is scored
CURVE_BINS = 48


@dataclass
class Perplexity:
    length: int
    protocol: str  # "nonoverlap", "sliding" or "same-tokens"
    stride: int
    nll: float  # mean negative log-likelihood per scored token, nats
    ppl: float
    bpb: Optional[float]  # bits per UTF-8 byte of the scored text (None without byte counts)
    tokens: int  # targets scored
    windows: int
    documents: int  # documents with at least one scored token
    skipped_documents: int = 0  # within-document mode: documents shorter than one window
    unit_kind: str = "blocks"  # the units of the intervals: "documents" or "blocks"
    unit_nll: list[float] = field(default_factory=list)
    unit_tokens: list[int] = field(default_factory=list)
    unit_bytes: list[int] = field(default_factory=list)
    curve: Optional[dict] = None  # {"edges", "mean", "sd", "n"}: loss by position, binned
    # Non-overlapping windows: per-unit NLL and token sums in log2 position bins
    # [0, 1), [1, 2), [2, 4), …, [2^k, length) of the window (position = tokens of context
    # before the predicted one, minus one), for loss-by-position intervals across runs.
    position_edges: list[int] = field(default_factory=list)
    position_unit_nll: list[list[float]] = field(default_factory=list)  # (bins, units)
    position_unit_tokens: list[list[int]] = field(default_factory=list)  # (bins, units)

    def to_dict(self) -> dict:
        return dict(vars(self))


def position_edges(length: int) -> np.ndarray:
    """0-based window position bin edges 0, 1, 2, 4, …, length (powers of two, then the end)."""
    powers = [0] + [2 ** i for i in range(max(1, length).bit_length()) if 2 ** i < length]
    return np.array(powers + [length], dtype=np.int64)


def curve_edges(length: int, bins: int = CURVE_BINS) -> np.ndarray:
    """Log-spaced 1-based position bin edges: bin i holds positions [edges[i], edges[i+1])."""
    return np.unique(np.round(np.geomspace(1, length + 1, bins + 1)).astype(np.int64))


class _Units:
    """Which unit each scored target belongs to (see the module docstring)."""

    def __init__(self, windows: list[EvalWindow], doc_index: np.ndarray):
        self.doc_index = doc_index
        scored = np.unique(np.concatenate([doc_index[w.start + 1 + w.score_from:w.start + 1 + w.length]
                                           for w in windows]))
        self.documents = len(scored)
        self.kind = "documents" if len(scored) >= MIN_DOCUMENTS else "blocks"
        if self.kind == "documents":
            self.scored, self.count = scored, min(len(scored), MAX_UNITS)
        else:
            self.count = min(BLOCKS, len(windows))
        self.block_of = {w.start: i * self.count // len(windows) for i, w in enumerate(windows)}

    def of(self, window: EvalWindow) -> np.ndarray:
        """Unit id of each of the window's targets (length,)."""
        if self.kind == "blocks":
            return np.full(window.length, self.block_of[window.start])
        docs = self.doc_index[window.start + 1:window.start + 1 + window.length]
        rank = np.clip(np.searchsorted(self.scored, docs), 0, len(self.scored) - 1)
        return rank * self.count // len(self.scored)


def layout(n_tokens: int, length: int, stride: int, max_tokens: Optional[int],
           spans: Optional[list[tuple[int, int]]],
           target: Optional[tuple[int, int]] = None) -> tuple[list[EvalWindow], int]:
    """(windows, documents skipped): over the stream, or inside ``spans`` when given; with
    ``target=(T, longest)`` the same-token windows (see the module docstring)."""
    if target is not None:
        windows, skipped = target_windows(spans if spans is not None else [(0, n_tokens - 1)], length, *target)
    elif spans is None:
        windows, skipped = eval_windows(n_tokens, length, stride=stride), 0
    else:
        windows, skipped = document_windows(spans, length, stride)
    return spread_windows(windows, max_tokens), skipped


def perplexity(model, tokens: np.ndarray, length: int, *, stride: Optional[int] = None,
               batch_size: int = 8, max_tokens: Optional[int] = None, token_bytes: Optional[np.ndarray] = None,
               eot_id: Optional[int] = None, within_document: bool = False, curve: bool = False,
               max_batch_tokens: int = 16384, target: Optional[tuple[int, int]] = None) -> Perplexity:
    """Perplexity at ``length``: non-overlapping windows (``stride`` None or = length), sliding,
    or with ``target=(T, longest)`` the same T-token spans scored at every length.

    ``token_bytes[id]`` is the UTF-8 byte length of token ``id`` (for bits per byte);
    ``eot_id`` marks document ends (units, and windows with ``within_document``).
    """
    stride = length if stride is None or target is not None else stride
    if within_document and eot_id is None:
        raise ValueError("within-document windows need the end-of-text id (eot_id)")
    spans = document_spans(tokens, eot_id) if within_document else None
    windows, skipped = layout(len(tokens), length, stride, max_tokens, spans, target)
    if not windows:
        need = length if target is None else target[1]
        longest = max((b - a for a, b in spans), default=0) if spans is not None else 0
        if spans is None:
            raise DataError(f"the split ({len(tokens)} tokens) is too short for a window of {need} tokens; "
                            "evaluate shorter lengths or use more text")
        raise DataError(f"no document holds a window of {need} tokens (all {skipped} are shorter; the "
                        f"longest has {longest} tokens); evaluate shorter lengths or turn within_document off")
    doc_index = np.zeros(len(tokens), dtype=np.int64)
    if eot_id is not None:  # doc_index[p]: the number of end-of-text tokens before position p
        doc_index[1:] = np.cumsum(np.asarray(tokens[:-1]) == eot_id)
    units = _Units(windows, doc_index)
    plain = stride == length and target is None  # non-overlapping: every window scores all its targets
    sums = _Sums(units.count, length if curve and plain else None, position_edges(length) if plain else None)
    byte_len = torch.from_numpy(token_bytes.astype(np.int64)) if token_bytes is not None else None
    for group, nll, y, mask in window_losses(model, tokens, windows, batch_size, max_batch_tokens):
        unit = torch.from_numpy(np.stack([units.of(w) for w in group]))  # (B, T)
        sums.add(nll, mask, unit, byte_len[y] if byte_len is not None else None)
    protocol = "same-tokens" if target is not None else "nonoverlap" if stride == length else "sliding"
    return sums.result(length, stride, protocol, len(windows), units, skipped)


class _Sums:
    """Running sums of one evaluation: per unit, and per position bin for the curve."""

    def __init__(self, n_units: int, curve_length: Optional[int], positions: Optional[np.ndarray] = None):
        self.nll = np.zeros(n_units)
        self.tokens = np.zeros(n_units, dtype=np.int64)
        self.bytes = np.zeros(n_units, dtype=np.int64)
        self.positions = positions  # log2 position bin edges (non-overlapping windows), or None
        if positions is not None:
            self.pos_nll = np.zeros((len(positions) - 1, n_units))
            self.pos_tokens = np.zeros((len(positions) - 1, n_units), dtype=np.int64)
        self.edges = curve_edges(curve_length) if curve_length else None
        if self.edges is not None:
            n_bins = len(self.edges) - 1
            self.bin_sum, self.bin_sq, self.bin_n = np.zeros(n_bins), np.zeros(n_bins), 0

    def add(self, nll: torch.Tensor, mask: torch.Tensor, unit: torch.Tensor, nbytes: Optional[torch.Tensor]) -> None:
        u = unit[mask].numpy()
        np.add.at(self.nll, u, nll[mask].double().numpy())
        np.add.at(self.tokens, u, 1)
        if nbytes is not None:
            np.add.at(self.bytes, u, nbytes[mask].numpy())
        if self.positions is not None:  # (bin, unit) of every target, by its index in the window
            bins = np.searchsorted(self.positions, np.arange(nll.shape[1]), side="right") - 1  # (T,)
            b = np.broadcast_to(bins, nll.shape)[mask.numpy()]
            np.add.at(self.pos_nll, (b, u), nll[mask].double().numpy())
            np.add.at(self.pos_tokens, (b, u), 1)
        if self.edges is not None:  # each window's mean loss per bin: one sample per window
            per_bin = np.stack([nll[:, a - 1:b - 1].double().mean(dim=1).numpy()
                                for a, b in zip(self.edges[:-1], self.edges[1:])], axis=1)  # (B, bins)
            self.bin_sum += per_bin.sum(axis=0)
            self.bin_sq += (per_bin ** 2).sum(axis=0)
            self.bin_n += per_bin.shape[0]

    def curve(self) -> Optional[dict]:
        if self.edges is None:
            return None
        n = self.bin_n
        mean = self.bin_sum / n
        var = np.maximum(self.bin_sq / n - mean ** 2, 0.0) * (n / (n - 1) if n > 1 else 0.0)
        return {"edges": self.edges.tolist(), "mean": [round(float(v), 5) for v in mean],
                "sd": [round(float(v), 5) for v in np.sqrt(var)], "n": n}

    def result(self, length: int, stride: int, protocol: str, n_windows: int, units: _Units,
               skipped: int) -> Perplexity:
        total, count, n_bytes = float(self.nll.sum()), int(self.tokens.sum()), int(self.bytes.sum())
        nll = total / count
        return Perplexity(
            length=length, protocol=protocol, stride=stride, nll=nll,
            ppl=perplexity_of(nll), bpb=total / math.log(2) / n_bytes if n_bytes else None, tokens=count,
            windows=n_windows, documents=units.documents, skipped_documents=skipped, unit_kind=units.kind,
            unit_nll=[round(float(v), 4) for v in self.nll], unit_tokens=self.tokens.tolist(),
            unit_bytes=self.bytes.tolist(), curve=self.curve(),
            **({} if self.positions is None else {
                "position_edges": self.positions.tolist(),
                "position_unit_nll": [[round(float(v), 4) for v in row] for row in self.pos_nll],
                "position_unit_tokens": self.pos_tokens.tolist()}))
