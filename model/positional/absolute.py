"""Absolute encodings added to the token embeddings at the input: sinusoidal and learned.

Treatment (so the comparison with RoPE/ALiBi is fair):
- sinusoidal: the token embedding is multiplied by √d_model before the encoding is
  added, as in Vaswani et al. (2017, §3.4). Token embeddings start at std 0.02 while the
  sinusoids have RMS 1/√2, so without the factor the input is mostly position.
- learned: the table is initialised like the token embedding (std ``init_std``) and both
  are trained, as in GPT-2; they start on the same scale, so no factor is applied.
``pos.token_scale`` overrides either factor, for the ablation in the extrapolation study.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ropelab.common.errors import LengthError
from ropelab.model.config import ModelConfig
from ropelab.model.positional.base import PositionalEncoding


def sinusoid_table(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(…), float32, (…, T, dim)."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = positions.to(torch.float64)[..., None] * inv_freq.to(positions.device)  # (…, T, dim/2)
    table = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (…, T, dim/2, 2)
    return table.flatten(-2).to(torch.float32)


class Sinusoidal(PositionalEncoding):
    """Vaswani et al. (2017) fixed sinusoids added to √d-scaled token embeddings."""

    kind = "sinusoidal"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dim = cfg.d_model
        self.scale = cfg.pos.token_scale if cfg.pos.token_scale is not None else math.sqrt(cfg.d_model)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x * self.scale + sinusoid_table(positions, self.dim).to(x.dtype)


class Learned(PositionalEncoding):
    """A trained table of ``pos.max_len`` absolute positions (GPT-2 style)."""

    kind = "learned"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.max_len = cfg.pos.max_len
        self.table = nn.Embedding(cfg.pos.max_len, cfg.d_model)
        self.scale = cfg.pos.token_scale if cfg.pos.token_scale is not None else 1.0

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Transformer.forward has already called check_length for these positions.
        return (x if self.scale == 1.0 else x * self.scale) + self.table(positions)

    def check_length(self, n_positions: int) -> None:
        if n_positions > self.max_len:
            raise LengthError(
                f"pos.kind=learned has a table of {self.max_len} positions "
                f"(pos.max_len={self.max_len}) but {n_positions} positions were requested. "
                "Learned absolute positions cannot extrapolate: use at most "
                f"{self.max_len} tokens, or retrain with a larger pos.max_len.")
