"""RoPE context extension: identities, hand-derived values, and parity with transformers."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.models import tiny_config
from ropelab.model.config import SCALING_TYPES, RopeScalingConfig
from ropelab.model.positional.rope_scaling import base_inv_freq, effective_scale, inverse_frequencies
from ropelab.model.transformer import Transformer

METHODS = [t for t in SCALING_TYPES if t != "none"]


def scaling(kind: str, factor: float, original: int = 128, **kw) -> RopeScalingConfig:
    return RopeScalingConfig(type=kind, factor=factor, original_max_len=original, **kw)


@pytest.mark.parametrize("kind", METHODS)
def test_factor_one_is_plain_rope(kind):
    """Factor 1 is plain RoPE for every method, and for dynamic NTK up to L0 only."""
    fit_len = 128 if kind == "dynamic" else 4096  # dynamic scales beyond L0 = 128 even at factor 1
    plain, plain_attn = inverse_frequencies(64, 10000.0, RopeScalingConfig())
    scaled, attn = inverse_frequencies(64, 10000.0, scaling(kind, 1.0), fit_len=fit_len)
    assert torch.equal(scaled, plain) and attn == plain_attn == 1.0
    x = torch.randint(0, 97, (1, 40))
    ref = Transformer(tiny_config()).eval()
    original = 40 if kind == "dynamic" else 16
    model = Transformer(tiny_config(scaling=scaling(kind, 1.0, original=original))).eval()
    model.load_state_dict(ref.state_dict())
    assert torch.equal(model(x), ref(x))


def test_dynamic_factor_one_scales_by_the_length_ratio():
    """transformers' semantics: base · (L/L0)^(d/(d−2)) once L > L0, with no factor needed."""
    inv, _ = inverse_frequencies(4, 10000.0, scaling("dynamic", 1.0, original=16), fit_len=64)
    assert torch.allclose(inv.double(), torch.tensor([1.0, 1 / 400], dtype=torch.float64), rtol=1e-6)  # base 1e4·4², ^-1/2
    for length, expected in ((16, 1.0), (8, 1.0), (32, 2.0), (256, 16.0)):
        assert effective_scale(scaling("dynamic", 1.0, original=16), length) == expected
    # With factor s at length L the scale is s·L/L0 − (s − 1): 13 at 4×L0 with s = 4 (the
    # double counting an evaluation must avoid by not also setting s = L/L0).
    assert effective_scale(scaling("dynamic", 4.0, original=16), 64) == 13.0
    assert effective_scale(scaling("yarn", 4.0), 10_000) == 4.0 and effective_scale(RopeScalingConfig()) == 1.0


# Hand-derived on dim 4, θ = 10000: plain inverse frequencies are [1, 1/100].
HAND = [
    ("linear", dict(factor=4), None, [0.25, 0.0025], 1.0),  # θ_i / 4
    ("ntk", dict(factor=4), None, [1.0, 0.0025], 1.0),  # base 1e4·4^(4/2) = 1.6e5 → 1/400
    ("dynamic", dict(factor=2, original=16), 32, [1.0, 1 / 300], 1.0),  # 2·32/16-1 = 3 → base 9e4
    ("dynamic", dict(factor=2, original=16), 16, [1.0, 0.01], 1.0),  # not longer than L0: plain
    # YaRN, L0=128, s=4: correction dims 4·ln(128/(2π·32))/(2 ln 1e4) = -0.098 → 0 and
    # 4·ln(128/2π)/(2 ln 1e4) = 0.654 → 1; ramp [0, 1]: pair 0 kept, pair 1 divided by 4.
    ("yarn", dict(factor=4), None, [1.0, 0.0025], 0.1 * math.log(4) + 1),
    # Llama 3, L0=2000, s=8, low/high factors 1/4: wavelengths 2π (< 500, kept) and 200π
    # (between 500 and 2000): smooth = (2000/200π - 1)/3, (1-smooth)·0.01/8 + smooth·0.01.
    ("llama3", dict(factor=8, original=2000), None,
     [1.0, (1 - (2000 / (200 * math.pi) - 1) / 3) * 0.01 / 8 + (2000 / (200 * math.pi) - 1) / 3 * 0.01], 1.0),
]


@pytest.mark.parametrize("kind,kw,seq_len,expected,attention", HAND)
def test_hand_derived_inverse_frequencies(kind, kw, seq_len, expected, attention):
    inv, attn = inverse_frequencies(4, 10000.0, scaling(kind, **kw), fit_len=seq_len)
    assert torch.allclose(inv.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6)
    assert attn == pytest.approx(attention, rel=1e-12)


def test_yarn_attention_factor_scales_cos_and_sin():
    model = Transformer(tiny_config(scaling=scaling("yarn", 4.0, original=16)))
    cos, sin = model.pos.cos_sin(torch.arange(5))
    assert torch.allclose(cos[0], torch.full_like(cos[0], 0.1 * math.log(4) + 1))
    assert torch.allclose(cos ** 2 + sin ** 2, torch.full_like(cos, (0.1 * math.log(4) + 1) ** 2))


def test_methods_change_frequencies_as_documented():
    plain = base_inv_freq(64, 10000.0).float()
    for kind in METHODS:
        inv, _ = inverse_frequencies(64, 10000.0, scaling(kind, 4.0), fit_len=512)
        assert inv[0] == pytest.approx(float(plain[0]) / (4 if kind == "linear" else 1), rel=1e-6)
        assert inv[-1] < plain[-1]  # the slowest pair is always slowed down


# --- parity with Hugging Face transformers' modeling_rope_utils ---------------------

def hf_inverse_frequencies(kind, head_dim, theta, factor, original, fraction, seq_len, extra):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": kind, "rope_theta": theta, "factor": factor,
              "original_max_position_embeddings": original, "partial_rotary_factor": fraction, **extra}
    hf_kind = kind
    if kind == "ntk":
        # transformers has no static NTK; dynamic NTK with factor 1 at seq_len = s·L0 gives
        # base·s^(d/(d-2)) exactly, the static formula.
        params.update(rope_type="dynamic", factor=1.0)
        hf_kind, seq_len = "dynamic", int(factor * original)
    config = transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                                      max_position_embeddings=original, rope_parameters=params)
    return ROPE_INIT_FUNCTIONS[hf_kind](config, "cpu", seq_len=seq_len)


CASES = [
    # kind, head_dim, theta, factor, L0, rotary fraction, seq_len, extra settings
    ("linear", 64, 10000.0, 4.0, 128, 1.0, None, {}),
    ("linear", 32, 1e6, 2.5, 256, 0.5, None, {}),
    ("ntk", 64, 10000.0, 4.0, 128, 1.0, None, {}),
    ("ntk", 48, 500000.0, 8.0, 512, 0.5, None, {}),
    ("dynamic", 64, 10000.0, 4.0, 128, 1.0, 700, {}),
    ("dynamic", 64, 10000.0, 1.0, 128, 1.0, 700, {}),  # factor 1 still scales beyond L0
    ("dynamic", 64, 10000.0, 1.0, 128, 1.0, 100, {}),
    ("dynamic", 32, 500000.0, 1.0, 256, 0.5, 4096, {}),
    ("dynamic", 64, 10000.0, 2.0, 128, 1.0, 100, {}),
    ("dynamic", 32, 1e6, 8.0, 256, 0.25, 4096, {}),
    ("yarn", 64, 10000.0, 4.0, 128, 1.0, None, {}),
    ("yarn", 64, 10000.0, 16.0, 128, 1.0, None, {"beta_fast": 16.0, "beta_slow": 2.0}),
    ("yarn", 128, 1e6, 32.0, 4096, 1.0, None, {"truncate": False}),
    ("yarn", 64, 10000.0, 4.0, 128, 0.5, None, {"attention_factor": 1.5}),
    ("llama3", 128, 500000.0, 8.0, 8192, 1.0, None, {"low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ("llama3", 64, 10000.0, 4.0, 128, 1.0, None, {"low_freq_factor": 2.0, "high_freq_factor": 8.0}),
]


@pytest.mark.parametrize("kind,head_dim,theta,factor,original,fraction,seq_len,extra", CASES)
def test_matches_transformers(kind, head_dim, theta, factor, original, fraction, seq_len, extra):
    hf_inv, hf_attn = hf_inverse_frequencies(kind, head_dim, theta, factor, original, fraction, seq_len, extra)
    ours, attn = inverse_frequencies(int(head_dim * fraction), theta,
                                     scaling(kind, factor, original, **extra), fit_len=seq_len)
    assert ours.shape == hf_inv.shape
    assert torch.allclose(ours, hf_inv.float(), atol=1e-6, rtol=0)
    assert attn == pytest.approx(float(hf_attn), rel=1e-9)
