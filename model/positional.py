"""Positional encodings behind one interface, chosen by ``pos.kind``.

An encoding may act in three places and overrides only what it needs:
``embed(x, positions)`` (additive absolute encodings at the input),
``rotate(q, k, positions, seq_len)`` (RoPE) and ``bias(q_positions, k_positions)``
(ALiBi). Attention calls ``rotate`` and ``bias`` unconditionally. Positions are always an
explicit 1-D integer tensor; tables and angles are computed in float32.

Treatment of additive absolute encodings (so the comparison with RoPE/ALiBi is fair):
- sinusoidal: the token embedding is multiplied by √d_model before the encoding is
  added, as in Vaswani et al. (2017, §3.4). Token embeddings start at std 0.02 while the
  sinusoids have RMS 1/√2, so without the factor the input is mostly position.
- learned: the table is initialised like the token embedding (std ``init_std``) and both
  are trained, as in GPT-2; they start on the same scale, so no factor is applied.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from model.config import ModelConfig
from model.errors import LengthError


class PositionalEncoding(nn.Module):
    """The no-op base: NoPE (``kind: none``) is exactly this."""

    #: largest number of positions this encoding can serve (None: unbounded)
    max_positions: Optional[int] = None
    #: whether ``bias`` returns a tensor; lets attention keep its fused causal path otherwise
    has_bias: bool = False

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               seq_len: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> Optional[torch.Tensor]:
        return None

    def check_length(self, n_positions: int) -> None:
        """Raise LengthError if positions 0 … n_positions-1 cannot all be served."""
        if self.max_positions is not None and n_positions > self.max_positions:
            raise LengthError(
                f"pos.kind=learned has a table of {self.max_positions} positions "
                f"(pos.max_len={self.max_positions}) but {n_positions} positions were requested. "
                "Learned absolute positions cannot extrapolate: use at most "
                f"{self.max_positions} tokens, or retrain with a larger pos.max_len.")


class NoPE(PositionalEncoding):
    """No positional information beyond the causal mask (Kazemnejad et al. 2023)."""


def sinusoid_table(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(…), float32, (T, dim)."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(positions.device)[None, :]
    table = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (T, dim/2, 2)
    return table.flatten(-2).to(torch.float32)


class Sinusoidal(PositionalEncoding):
    """Vaswani et al. (2017) fixed sinusoids added to √d-scaled token embeddings."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dim = cfg.d_model
        self.scale = math.sqrt(cfg.d_model)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x * self.scale + sinusoid_table(positions, self.dim).to(x.dtype)


class Learned(PositionalEncoding):
    """A trained table of ``pos.max_len`` absolute positions (GPT-2 style)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.max_positions = cfg.pos.max_len
        self.table = nn.Embedding(cfg.pos.max_len, cfg.d_model)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Transformer.forward has already called check_length for these positions.
        return x + self.table(positions)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al. (2022) head slopes.

    For n a power of two: the geometric sequence starting at 2^(-8/n) with that ratio.
    Otherwise (the paper's rule, §3 and its reference code): the slopes of the closest
    smaller power of two m, followed by every other slope of 2m, up to n in total.
    """
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if n_heads & (n_heads - 1) == 0:
        slopes = power_of_two(n_heads)
    else:
        m = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(m) + power_of_two(2 * m)[0::2][: n_heads - m]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(PositionalEncoding):
    """Linear attention biases: head h adds -slope_h · (i - j) to the score of query i, key j."""

    has_bias = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(cfg.n_heads), persistent=False)

    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        distance = (q_positions[:, None] - k_positions[None, :]).to(torch.float32)  # (Tq, Tk)
        return -self.slopes[:, None, None] * distance  # (H, Tq, Tk)


def build_positional(cfg: ModelConfig) -> PositionalEncoding:
    """One instance per model, shared by all blocks."""
    from model.rope import RoPE  # RoPE imports this module for the base class

    registry = {"rope": RoPE, "sinusoidal": Sinusoidal, "learned": Learned,
                "alibi": ALiBi, "none": lambda cfg: NoPE()}
    return registry[cfg.pos.kind](cfg)
