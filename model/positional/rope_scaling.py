"""RoPE inverse frequencies, plain and with context-extension scaling.

Each method maps (rotary dim d, base θ, scaling settings, current length) to the inverse
frequencies θ_i = base^(-2i/d), i = 0 … d/2-1, and an attention factor that multiplies
cos and sin. The formulas follow the papers and agree with Hugging Face transformers'
``modeling_rope_utils`` for the same settings (tests/unit/test_rope_scaling.py checks this):

- linear  — position interpolation (Chen et al. 2023): θ_i / s.
- ntk     — "NTK-aware" base change (bloc97, 2023): base · s^(d/(d-2)).
- dynamic — dynamic NTK (emozilla, 2023), with transformers' semantics exactly: the ntk
            base with the effective scale s·L/L0 − (s−1) once the sequence length L
            exceeds L0, else plain RoPE. With factor s = 1 the scale is L/L0: the method
            as published, which needs no factor because it adapts to the length itself.
            So an evaluation at L must not also set s = L/L0 (that gives s² − s + 1).
- yarn    — YaRN (Peng et al. 2023, §3.2-3.4): per-dimension ramp between interpolation
            and extrapolation, boundaries at β_fast and β_slow rotations over L0, and the
            attention factor 0.1·ln s + 1 applied to cos and sin.
- llama3  — Llama 3.1 (Meta 2024): wavelengths longer than L0/low_freq_factor are
            interpolated by s, shorter than L0/high_freq_factor kept, smooth in between.

p-RoPE (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional
Encodings useful?", ICLR 2025) composes with all of them: ``keep_highest_frequencies``
sets the lowest frequencies of the scaled ones to 0, so those pairs never rotate.

Computed in float64 and returned as float32, so results do not depend on the model dtype.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ropelab.model.config import RopeScalingConfig


def base_inv_freq(dim: int, theta: float) -> torch.Tensor:
    """θ_i = theta^(-2i/dim) for i = 0 … dim/2 - 1, in float64."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return 1.0 / (theta ** exponents)


def ntk_base(theta: float, factor: float, dim: int) -> float:
    """The "NTK-aware" base θ·s^(d/(d−2)) (bloc97 2023): the slowest pair is interpolated
    by exactly s while the fastest keeps its frequency."""
    return theta * factor ** (dim / (dim - 2))


def _yarn_correction_dim(rotations: float, dim: int, theta: float, original_len: int) -> float:
    """The (fractional) pair index whose wavelength fits ``rotations`` times into original_len."""
    return dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def _yarn(dim: int, theta: float, s: RopeScalingConfig) -> tuple[torch.Tensor, float]:
    extrapolated = base_inv_freq(dim, theta)
    interpolated = extrapolated / s.factor
    low = _yarn_correction_dim(s.beta_fast, dim, theta, s.original_max_len)
    high = _yarn_correction_dim(s.beta_slow, dim, theta, s.original_max_len)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    # ramp = 0 for fast (high-frequency) pairs: keep them; ramp = 1: interpolate fully.
    inv_freq = extrapolated * (1 - ramp) + interpolated * ramp
    if s.attention_factor is not None:
        attention = s.attention_factor
    else:
        attention = 0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0
    return inv_freq, attention


def _llama3(dim: int, theta: float, s: RopeScalingConfig) -> torch.Tensor:
    inv_freq = base_inv_freq(dim, theta)
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = s.original_max_len / s.low_freq_factor
    high_freq_wavelen = s.original_max_len / s.high_freq_factor
    smooth = (s.original_max_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    out = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, out)


def effective_scale(scaling: RopeScalingConfig, fit_len: Optional[int] = None) -> float:
    """The context-extension scale a method applies to a sequence of ``fit_len`` tokens.

    1 for plain RoPE, the factor for the static methods, and for dynamic NTK
    s·max(L, L0)/L0 − (s − 1), which grows with the length (transformers'
    ``_compute_dynamic_ntk_parameters``; L0 is ``original_max_len``).
    """
    if scaling.type == "none":
        return 1.0
    if scaling.type == "dynamic":
        length = max(fit_len or 0, scaling.original_max_len)
        return scaling.factor * length / scaling.original_max_len - (scaling.factor - 1)
    return scaling.factor


def keep_highest_frequencies(inv_freq: torch.Tensor, kept: int) -> torch.Tensor:
    """p-RoPE: keep the ``kept`` highest inverse frequencies (the first; θ_i decreases with
    i) and set the rest to 0. ``kept`` is ModelConfig.kept_frequencies:
    floor(frequency_fraction · r/2), the paper's rule; all of them for plain RoPE."""
    if kept >= inv_freq.shape[0]:
        return inv_freq
    out = inv_freq.clone()
    out[kept:] = 0.0
    return out


def inverse_frequencies(dim: int, theta: float, scaling: RopeScalingConfig,
                        fit_len: Optional[int] = None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (float32, shape (dim/2,)) and the cos/sin attention factor.

    ``fit_len`` is the length the frequencies must serve; only ``dynamic`` uses it.
    """
    kind, scale = scaling.type, effective_scale(scaling, fit_len)
    if scale == 1.0:  # every method is plain RoPE at scale 1
        inv_freq, attention = base_inv_freq(dim, theta), 1.0
    elif kind == "linear":
        inv_freq, attention = base_inv_freq(dim, theta) / scale, 1.0
    elif kind in ("ntk", "dynamic"):
        inv_freq, attention = base_inv_freq(dim, ntk_base(theta, scale, dim)), 1.0
    elif kind == "yarn":
        inv_freq, attention = _yarn(dim, theta, scaling)
    elif kind == "llama3":
        inv_freq, attention = _llama3(dim, theta, scaling), 1.0
    else:  # the config's Literal makes this unreachable from YAML
        raise ValueError(f"unknown RoPE scaling type {kind!r}")
    return inv_freq.to(torch.float32), float(attention)
