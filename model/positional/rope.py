"""Rotary position embeddings (Su et al. 2021, RoFormer) on queries and keys.

Two ways to pair the rotated dimensions exist in the wild and are not interchangeable
with the same weights:
- ``half`` (GPT-NeoX / HF LLaMA): dim i pairs with dim i + r/2; cos/sin are the r/2
  angles concatenated twice and the 90° turn is ``rotate_half``.
- ``interleaved`` (RoFormer / Meta LLaMA): dim 2i pairs with 2i+1; cos/sin are the angles
  repeat-interleaved and the turn swaps within adjacent pairs.
Each pairing is one object that owns both its cos/sin layout and its turn, so a
mismatched combination cannot be built.

Only the first ``rotary_dim`` dims of each head rotate (partial rotary); the rest pass
through. p-RoPE (``frequency_fraction``, Barbero et al. 2024) is another cut: every dim
stays in a pair, but only the highest frequencies turn and the lowest get frequency 0
(cos 1, sin 0: exactly the identity), after any scaling (rope_scaling.py). Angles, cos
and sin and the rotation itself are float32 whatever the model dtype (bf16 cannot even
represent consecutive integer positions above 256).

Dynamic NTK and the KV cache: with ``dynamic`` scaling the frequencies depend on the
sequence length. Keys are rotated once, when they enter the cache, so every key and every
query of one sequence must use the same frequencies: those fitted to ``fit_len``, the
length of the whole sequence (model/config.py). An uncached forward fits them to its own
length; a cached one to the cache's size, which generation sets to prompt +
max_new_tokens and also passes to its uncached path. Cached decoding therefore equals an
uncached forward over the full planned length exactly, instead of mixing keys rotated
under different bases as a per-step recomputation would.

Per forward, ``RoPE.rotation`` gathers cos/sin for the forward's positions once; every
layer then rotates with the same ``Rotation``. Per-sequence positions (B, T) gather
(B, 1, T, r) tables that broadcast over the heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ropelab.model.config import ModelConfig
from ropelab.model.positional.base import PositionalEncoding
from ropelab.model.positional.rope_scaling import inverse_frequencies, keep_highest_frequencies


class HalfPairing:
    """NeoX/LLaMA layout: pairs (i, i + r/2)."""

    @staticmethod
    def layout(angles: torch.Tensor) -> torch.Tensor:
        return torch.cat((angles, angles), dim=-1)

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    @staticmethod
    def pairs(x: torch.Tensor) -> torch.Tensor:
        """x (…, r) as its r/2 rotation pairs (…, r/2, 2); pair i turns at angle frequency i."""
        return torch.stack(x.chunk(2, dim=-1), dim=-1)


class InterleavedPairing:
    """RoFormer/Meta layout: pairs (2i, 2i+1)."""

    @staticmethod
    def layout(angles: torch.Tensor) -> torch.Tensor:
        return angles.repeat_interleave(2, dim=-1)

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        pairs = x.unflatten(-1, (-1, 2))  # (..., r/2, 2)
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)

    @staticmethod
    def pairs(x: torch.Tensor) -> torch.Tensor:
        """x (…, r) as its r/2 rotation pairs (…, r/2, 2); pair i turns at angle frequency i."""
        return x.unflatten(-1, (-1, 2))


PAIRINGS = {"half": HalfPairing, "interleaved": InterleavedPairing}


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing, rotary_dim: int) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` dims of x (…, T, D) by laid-out cos/sin (T, rotary_dim)."""
    x_rot = x[..., :rotary_dim].float()
    out = x_rot * cos + pairing.rotate_half(x_rot) * sin
    if rotary_dim < x.shape[-1]:
        out = torch.cat((out, x[..., rotary_dim:].float()), dim=-1)
    return out.to(x.dtype)


@dataclass(frozen=True, eq=False)
class Rotation:
    """cos/sin gathered for one forward's positions; rotates q and k of every layer."""

    cos: torch.Tensor  # (T, rotary_dim) or (B, 1, T, rotary_dim), laid out for the pairing, float32
    sin: torch.Tensor
    pairing: type
    rotary_dim: int

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (rotate(q, self.cos, self.sin, self.pairing, self.rotary_dim),
                rotate(k, self.cos, self.sin, self.pairing, self.rotary_dim))


class RoPE(PositionalEncoding):
    """Rotary embeddings with optional context-extension scaling (rope_scaling.py)."""

    kind = "rope"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        rope = cfg.pos.rope
        self.rotary_dim = cfg.rotary_dim
        self.theta = rope.theta
        self.scaling = rope.scaling
        self.pairing = PAIRINGS[rope.pairing]
        self.kept_frequencies = cfg.kept_frequencies
        self.dynamic = rope.scaling.type == "dynamic"
        # A plain float32 attribute, not a buffer: ``model.to(torch.bfloat16)`` casts
        # buffers, and bf16 frequencies put cos off by up to 0.86 below position 2048.
        # Frequencies are config, so scaling can change at eval time without touching
        # checkpoints; tables are built on the positions' device.
        self.inv_freq, self.attention_factor = self.frequencies()
        # (key, cos, sin): tables for positions 0 … n-1, reused by every forward.
        self._tables: Optional[tuple] = None

    def frequencies(self, fit_len: Optional[int] = None) -> tuple[torch.Tensor, float]:
        """Inverse frequencies (scaled, then p-RoPE's lowest set to 0) and the attention factor."""
        inv_freq, attention = inverse_frequencies(self.rotary_dim, self.theta, self.scaling, fit_len)
        return keep_highest_frequencies(inv_freq, self.kept_frequencies), attention

    def rotation(self, positions: torch.Tensor, fit_len: Optional[int] = None) -> Rotation:
        cos, sin = self.cos_sin(positions, fit_len)
        return Rotation(cos, sin, self.pairing, self.rotary_dim)

    def cos_sin(self, positions: torch.Tensor, fit_len: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Laid-out cos and sin for ``positions``, float32, any length: (T, rotary_dim) for
        positions (T,), (B, 1, T, rotary_dim) for per-sequence positions (B, T).

        ``fit_len`` bounds the positions (last position < fit_len); without it the positions
        are read (a device sync on GPUs, which Transformer.forward avoids by passing it).
        """
        length = fit_len if fit_len is not None else int(positions.max()) + 1
        cos, sin = self._cos_sin_tables(length, positions.device)
        cos, sin = cos[positions], sin[positions]
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, r): the same angles for every head
        return cos, sin

    def _cos_sin_tables(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables covering positions 0 … length-1, built once and reused.

        Recomputing angles, cos and sin in every layer of every step cost as much as the
        rotation itself. Plain frequencies do not depend on the length, so one table grown
        in powers of two serves every call; dynamic NTK's frequencies do, so its table is
        rebuilt whenever the fitted length changes (once per generation).
        """
        if self._tables is not None:
            (dynamic_len, rows, table_device), cos, sin = self._tables
            if table_device == device and (dynamic_len == length if self.dynamic else rows >= length):
                return cos, sin
        rows = length if self.dynamic else max(256, 1 << (length - 1).bit_length())
        inv_freq, attention = self.inv_freq, self.attention_factor
        if self.dynamic:
            inv_freq, attention = self.frequencies(length)
        # Built outside inference mode so a table first made during evaluation can still be
        # saved for backward by a later training step.
        with torch.inference_mode(False), torch.no_grad():
            positions = torch.arange(rows, device=device, dtype=torch.float32)
            angles = positions[:, None] * inv_freq.to(device)[None, :]  # (rows, r/2)
            angles = self.pairing.layout(angles)  # (rows, r)
            cos, sin = angles.cos() * attention, angles.sin() * attention
        self._tables = ((length if self.dynamic else None, rows, device), cos, sin)
        return cos, sin
