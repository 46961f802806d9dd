"""xPos: RoPE with an exponential decay per frequency (Sun et al. 2022, "A
Length-Extrapolatable Transformer", ACL 2023).

Rotation pair i (of r/2) of a query at position n is multiplied by ζ_i^(n/B) and of a key
at m by ζ_i^(−m/B), with ζ_i = (2i/r + γ)/(1 + γ), γ = 0.4 and scale base B = 512. The
score of that pair then carries ζ_i^((n−m)/B) ≤ 1: a decay with distance that is
strongest for the fastest-rotating (lowest i) pairs. Everything else is RoPE with the
``pos.rope`` settings (theta, pairing, rotary_fraction, frequency_fraction, scaling).

Keys are scaled at their own positions when they enter the KV cache, like their rotation,
so cached decoding equals the full forward.

Float range. ζ_0^(−m/B) grows without bound: at γ = 0.4 it is 3.5^(m/512).
Only n − m matters to the score, so positions are measured from the middle of the
sequence, c = fit_len // 2 (the authors' torchscale code centres them too), which halves
the exponent; c is fixed for a whole sequence (fit_len, see rope.py), so a KV cache stays
consistent. Scales are kept within 2^±64 (config.XPOS_MAX_LOG2), leaving float32 and
bfloat16 ~2^64 of headroom for q·k: with the defaults that serves sequences of up to
36,261 positions (``XposConfig.max_len``); longer ones are refused with a LengthError.
float16 has 5 exponent bits and overflows far sooner: beyond a scale of 2^8 the rotation
refuses it and asks for bfloat16 or float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ropelab.model.config import ModelConfig
from ropelab.common.errors import LengthError
from ropelab.model.positional.rope import RoPE, rotate

FLOAT16_MAX_SCALE = 2.0 ** 8  # keys of |k| ~ 100 still fit float16's 65504


def xpos_zeta(rotary_dim: int, gamma: float) -> torch.Tensor:
    """ζ_i = (2i/r + γ)/(1 + γ) for pairs i = 0 … r/2−1, float64."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return (2 * i / rotary_dim + gamma) / (1 + gamma)


@dataclass(frozen=True, eq=False)
class ScaledRotation:
    """cos/sin already multiplied by the query's scale and divided by the key's (…, T, r)."""

    q_cos: torch.Tensor
    q_sin: torch.Tensor
    k_cos: torch.Tensor
    k_sin: torch.Tensor
    pairing: type
    rotary_dim: int
    max_scale: float  # the largest scale of this forward (host float)

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if q.dtype == torch.float16 and self.max_scale > FLOAT16_MAX_SCALE:
            raise LengthError(f"xPos scales keys by up to {self.max_scale:.3g} at this length, which "
                              "overflows float16; use train.dtype=bfloat16 or float32, or a shorter sequence")
        return (rotate(q, self.q_cos, self.q_sin, self.pairing, self.rotary_dim),
                rotate(k, self.k_cos, self.k_sin, self.pairing, self.rotary_dim))


class XPos(RoPE):
    """RoPE whose pair i decays as ζ_i^((n−m)/scale_base) with the query-key distance."""

    kind = "xpos"

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.scale_base = cfg.pos.xpos.scale_base
        self.max_len = cfg.pos.xpos.max_len
        zeta = xpos_zeta(self.rotary_dim, cfg.pos.xpos.gamma)
        # float32 attribute, not a buffer, so a bf16 cast of the model keeps the scales exact
        self.log_zeta = (zeta.log() / self.scale_base).float()  # (r/2,)
        self.log_inv_zeta_min = -math.log(float(zeta.min())) / self.scale_base

    def check_length(self, n_positions: int) -> None:
        if n_positions > self.max_len:
            raise LengthError(
                f"pos.kind=xpos serves at most {self.max_len} positions (pos.xpos.scale_base="
                f"{self.scale_base:g}): beyond that its key scales leave the float range. "
                f"Use at most {self.max_len} tokens, or a larger pos.xpos.scale_base.")

    def rotation(self, positions: torch.Tensor, fit_len: Optional[int] = None) -> ScaledRotation:
        fit_len = fit_len if fit_len is not None else int(positions.max()) + 1
        self.check_length(fit_len)
        cos, sin = self.cos_sin(positions, fit_len)
        centre = fit_len // 2
        exponent = (positions.float() - centre)[..., None] * self.log_zeta.to(positions.device)  # (…, T, r/2)
        scale = self.pairing.layout(exponent.exp())  # (…, T, r): the query's; the key's is 1/scale
        if positions.dim() == 2:
            scale = scale[:, None]  # (B, 1, T, r), like cos and sin
        max_scale = math.exp(centre * self.log_inv_zeta_min)
        return ScaledRotation(cos * scale, sin * scale, cos / scale, sin / scale, self.pairing,
                              self.rotary_dim, max_scale)
