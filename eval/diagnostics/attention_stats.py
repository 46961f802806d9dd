"""What the diagnostics measure in one window's attention: pure functions of its probabilities.

For every head, over the window's queries i = 0 … T−1 (query i sees keys j ≤ i, i + 1 of them):

- entropy H_i = −Σ_j p_ij ln p_ij (nats; ln(i + 1) for uniform attention), its mean over the
  queries and its mean in log-spaced bins of i (``log2_bin``: 0, 1, 2–3, 4–7, …);
- attended distance d_i = Σ_j p_ij (i − j), its mean over the queries, and the distribution
  of the attention mass over log-spaced distance bins (0, 1, 2–3, 4–7, …), averaged over the
  queries (each query's row sums to 1, so the bins of a head sum to 1);
- sink mass: the mean over the queries of the mass on the first ``sink_tokens`` keys (with
  one token, Gu et al. 2025's α₁ = (1/T) Σ_i p_i0);
- needle mass: the mean over given query rows (those predicting a passkey's answer) of the
  mass on given keys (the key's tokens).

Rows are read in chunks (``LayerAttention.probabilities``), so a window of 16×L never holds
its T × T matrix; every sum is over float32 probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ropelab.eval.diagnostics.attention_probe import LayerAttention

Tensor = torch.Tensor
CHUNK_ELEMENTS = 1 << 20  # probabilities per chunk of query rows (4 MB of float32; smaller chunks skip more masked keys)
MAP_SIZE = 64  # an example attention map is averaged down to at most this many rows and columns (a run's
# cached diagnostics, which keep it, stay small enough to commit as a grid's record)


def log2_bin(values: Tensor) -> Tensor:
    """The log-spaced bin of non-negative integers: 0 → 0, v ≥ 1 → ⌊log₂ v⌋ + 1, so bins are
    {0}, {1}, {2, 3}, {4 … 7}, …"""
    v = values.long()
    return torch.where(v > 0, torch.log2(v.clamp(min=1).double()).floor().long() + 1, 0)


def n_bins(length: int) -> int:
    """Bins of ``log2_bin`` covering 0 … length − 1 (query indices, or distances)."""
    return int(log2_bin(torch.tensor(max(length - 1, 0)))) + 1


def bin_edges(length: int) -> list[int]:
    """The first value of each bin, then ``length``: [0, 1, 2, 4, …, length]."""
    return [0] + [1 << b for b in range(n_bins(length) - 1)] + [length]


@dataclass
class HeadStats:
    """One window's measures for one layer, per head (numpy float64; B = 1 window)."""

    entropy: np.ndarray  # (H,): mean over queries
    entropy_by_position: np.ndarray  # (H, bins): mean over the queries of each bin of i
    distance: np.ndarray  # (H,): mean attended distance
    distance_histogram: np.ndarray  # (H, bins): mass per distance bin, mean over queries
    sink: np.ndarray  # (H,): mean mass on the first sink_tokens keys


def head_stats(att: LayerAttention, sink_tokens: int) -> HeadStats:
    """Every per-head measure of one window (batch of one) of one layer."""
    T, device = att.length, att.q.device
    nb = n_bins(T)
    keys = torch.arange(T, dtype=torch.float32, device=device)
    lower = torch.tensor(bin_edges(T)[:-1], device=device)  # (nb,): each distance bin's smallest distance
    sums = {name: 0.0 for name in ("entropy", "distance", "sink", "histogram")}
    by_position = torch.zeros(att.q.shape[1], nb, dtype=torch.float64, device=device)
    rows_per_chunk = max(1, CHUNK_ELEMENTS // (att.q.shape[1] * T))
    for start in range(0, T, rows_per_chunk):
        rows = torch.arange(start, min(start + rows_per_chunk, T), device=device)
        p = att.probabilities(rows)[0]  # (H, tq, K): keys up to the chunk's last query
        entropy = torch.special.entr(p).sum(-1)  # (H, tq)
        sums["entropy"] += entropy.double().sum(-1)
        by_position.index_add_(1, log2_bin(rows), entropy.double())
        sums["distance"] += (rows.float() - p @ keys[:p.shape[-1]]).double().sum(-1)  # Σ_j p_ij (i − j)
        sums["sink"] += p[..., :sink_tokens].sum(-1).double().sum(-1)
        sums["histogram"] += _distance_mass(p, rows, lower).double().sum(1)
    counts = torch.bincount(log2_bin(torch.arange(T, device=device)), minlength=nb).double()
    return HeadStats(entropy=_numpy(sums["entropy"] / T), entropy_by_position=_numpy(by_position / counts),
                     distance=_numpy(sums["distance"] / T), distance_histogram=_numpy(sums["histogram"] / T),
                     sink=_numpy(sums["sink"] / T))


def _numpy(x: Tensor) -> np.ndarray:
    return x.double().cpu().numpy()


def _distance_mass(p: Tensor, rows: Tensor, lower: Tensor) -> Tensor:
    """(H, tq, bins): each query's attention mass per distance bin, from cumulative sums over keys
    (``p``: (H, tq, K), the keys up to the last query of ``rows``).

    The mass at distance ≥ a is the mass on keys j ≤ i − a, the cumulative sum at key i − a
    (0 where i − a < 0); a bin [a, b) holds the difference of two such tails.
    """
    cumulative = p.cumsum(-1)  # (H, tq, K)
    index = rows[:, None] - lower[None, :]  # (tq, nb): key i − a for each bin's lower edge a
    tails = cumulative.gather(-1, index.clamp(min=0).expand(p.shape[0], -1, -1))  # (H, tq, nb)
    tails = tails.masked_fill(index < 0, 0.0)
    return tails - torch.cat((tails[..., 1:], torch.zeros_like(tails[..., :1])), dim=-1)


def needle_mass(att: LayerAttention, rows: Tensor, needle: Tensor) -> np.ndarray:
    """(H,): the mean over query ``rows`` of the attention mass on the keys where ``needle`` (T,) is True."""
    p = att.probabilities(rows)[0]  # (H, tq, K)
    return _numpy(p[..., needle[:p.shape[-1]]].sum(-1).mean(-1))


def example_map(att: LayerAttention) -> np.ndarray:
    """The head-averaged (T, T) attention of one window, averaged over blocks down to at most
    MAP_SIZE × MAP_SIZE (a block's value is the mean probability in it)."""
    rows = torch.arange(att.length, device=att.q.device)
    full = att.probabilities(rows)[0].mean(0)  # (T, T)
    size = min(MAP_SIZE, att.length)
    return _numpy(torch.nn.functional.adaptive_avg_pool2d(full[None], (size, size))[0])
