"""RoPE: the worked example, relative-position invariance, norms, the two pairings, p-RoPE."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.models import tiny_config
from ropelab.model.config import RopeScalingConfig
from ropelab.model.positional.rope import PAIRINGS, HalfPairing, InterleavedPairing, RoPE
from ropelab.model.transformer import Transformer


def rope(head_dim: int, pairing: str, rotary_fraction: float = 1.0, theta: float = 10000.0) -> RoPE:
    cfg = tiny_config(pairing=pairing, rotary_fraction=rotary_fraction, d_model=head_dim * 4)
    cfg.pos.rope.theta = theta
    return RoPE(cfg)


def rotate_one(enc: RoPE, x: torch.Tensor, position: int) -> torch.Tensor:
    """Rotate a single head vector x (D,) to ``position``."""
    q = x.view(1, 1, 1, -1)
    out, _ = enc.rotation(torch.tensor([position]))(q, q.clone())
    return out.view(-1)


@pytest.mark.parametrize("pairing,expected", [
    ("interleaved", [-0.4161, 0.9093, -0.0200, 0.9998]),
    ("half", [-0.4161, -0.0200, 0.9093, 0.9998]),
])
def test_worked_example(pairing, expected):
    out = rotate_one(rope(4, pairing), torch.tensor([1.0, 0.0, 0.0, 1.0]), 2)
    assert torch.allclose(out, torch.tensor(expected), atol=5e-5)
    assert [round(v, 4) for v in out.tolist()] == expected


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("fraction", [1.0, 0.5, 0.25])
def test_dot_product_depends_only_on_offset(pairing, fraction):
    enc = rope(16, pairing, fraction)
    q, k = torch.randn(16), torch.randn(16)

    def score(m: int, n: int) -> float:
        return float(rotate_one(enc, q, m) @ rotate_one(enc, k, n))

    base = score(0, 5)
    assert score(10, 15) == pytest.approx(base, abs=1e-5)
    assert score(1000, 1005) == pytest.approx(base, abs=2e-3)  # float32 angles at ~1e3
    assert score(0, 6) != pytest.approx(base, abs=1e-3)  # and it does depend on the offset


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_rotation_preserves_norm_and_passthrough(pairing):
    enc = rope(16, pairing, rotary_fraction=0.5)
    x = torch.randn(16)
    for position in (0, 7, 4096):
        out = rotate_one(enc, x, position)
        assert out.norm() == pytest.approx(float(x.norm()), rel=1e-5)
        assert torch.equal(out[8:], x[8:])  # partial rotary leaves the tail alone
    assert not torch.allclose(rotate_one(enc, x, 7)[:8], x[:8])


def test_angles_are_float32_under_bf16():
    enc = rope(8, "half")
    cos, sin = enc.cos_sin(torch.arange(300, 302))
    assert cos.dtype == sin.dtype == torch.float32
    q = torch.randn(1, 1, 2, 8)
    out32, _ = enc.rotation(torch.arange(300, 302))(q, q)
    out16, _ = enc.rotation(torch.arange(300, 302))(q.bfloat16(), q.bfloat16())
    assert out16.dtype == torch.bfloat16
    # Only the final cast rounds: positions 300 and 301 stay distinct.
    assert torch.allclose(out16.float(), out32, atol=2e-2)
    assert not torch.allclose(out16[0, 0, 0].float(), out16[0, 0, 1].float())


def half_from_interleaved(d: int, rot: int) -> torch.Tensor:
    """Index map: half-split dim j takes interleaved dim perm[j]."""
    perm = list(range(0, rot, 2)) + list(range(1, rot, 2)) + list(range(rot, d))
    return torch.tensor(perm)


def attention_logits(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    """Pre-softmax scores q·kᵀ of the first layer, (B, H, T, T), as attention computes them."""
    attn, T = model.blocks[0].attn, idx.shape[1]
    x = model.blocks[0].attn_norm(model.pos.embed(model.tok_emb(idx), torch.arange(T)))
    q, k, _ = attn.wqkv(x)
    q, k = model.pos.context(torch.arange(T), T).rotate(q, k)
    k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
    return q @ k.transpose(-2, -1)


def sharpen(model: Transformer) -> Transformer:
    """Larger q/k weights so attention is far from uniform and logits depend on positions."""
    with torch.no_grad():
        for block in model.blocks:
            wq, wk, _ = block.attn.wqkv.parts()
            wq.mul_(20)
            wk.mul_(20)
    return model


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_pairings_agree_after_permuting_projection_rows(fraction):
    inter = sharpen(Transformer(tiny_config(pairing="interleaved", rotary_fraction=fraction)).eval())
    half = Transformer(tiny_config(pairing="half", rotary_fraction=fraction)).eval()
    half.load_state_dict(inter.state_dict())
    D, rot = inter.cfg.head_dim, inter.cfg.rotary_dim
    perm = half_from_interleaved(D, rot)
    x = torch.randint(0, 97, (2, 24))
    # The same weights under the other pairing give other scores and logits ...
    assert not torch.allclose(attention_logits(half, x), attention_logits(inter, x), atol=1e-2)
    assert not torch.allclose(half(x), inter(x), atol=1e-3)
    with torch.no_grad():
        for b_half, b_inter in zip(half.blocks, inter.blocks):
            for dst, w in zip(b_half.attn.wqkv.parts()[:2], b_inter.attn.wqkv.parts()[:2]):  # q and k rows
                heads = w.shape[0] // D  # w: (heads * D, d)
                dst.copy_(w.view(heads, D, -1)[:, perm].reshape(w.shape))
    # ... and after permuting the q/k projection rows they agree.
    assert torch.allclose(attention_logits(half, x), attention_logits(inter, x), atol=1e-4)
    assert torch.allclose(half(x), inter(x), atol=1e-5)


class MixedPairing:
    """Half-split turn with interleaved cos/sin layout: a layout bug, built on purpose."""

    layout = staticmethod(InterleavedPairing.layout)
    rotate_half = staticmethod(HalfPairing.rotate_half)


def test_mixed_pairing_gives_different_logits():
    x = torch.randint(0, 97, (1, 24))
    scores = {}
    for name, pairing in (("half", HalfPairing), ("interleaved", InterleavedPairing), ("mixed", MixedPairing)):
        model = Transformer(tiny_config(pairing="half")).eval()
        torch.manual_seed(1)  # same weights for every pairing
        model.reset_parameters()
        model.pos.pairing = pairing
        scores[name] = attention_logits(sharpen(model), x)
    assert not torch.allclose(scores["mixed"], scores["half"], atol=1e-2)
    assert not torch.allclose(scores["mixed"], scores["interleaved"], atol=1e-2)
    assert set(PAIRINGS) == {"half", "interleaved"}


def test_config_rejects_odd_rotary_dims():
    from ropelab.common.errors import ConfigError
    with pytest.raises(ConfigError, match="even whole number"):
        tiny_config(rotary_fraction=0.75, d_model=24, n_heads=4)  # 6 * 0.75 = 4.5
    with pytest.raises(ConfigError, match="even whole number"):
        tiny_config(rotary_fraction=0.375)  # 8 * 0.375 = 3


def test_a_bf16_model_keeps_float32_frequencies():
    """model.to(bfloat16) must not round the frequencies: cos/sin stay exact at long positions."""
    model = Transformer(tiny_config()).to(torch.bfloat16)  # head_dim 8
    positions = torch.arange(1990, 2048)
    cos, sin = model.pos.cos_sin(positions)
    inv_freq = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = positions.double()[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)  # half pairing layout
    assert cos.dtype == torch.float32
    assert (cos.double() - angles.cos()).abs().max() < 1e-4
    assert (sin.double() - angles.sin()).abs().max() < 1e-4


# ------------------------------------------------------------------ p-RoPE (Barbero et al. 2024)

def p_rope(head_dim: int, fraction: float, scaling=None) -> RoPE:
    return RoPE(tiny_config(frequency_fraction=fraction, scaling=scaling, d_model=head_dim * 4))


def test_p_rope_rotates_only_the_highest_frequencies_by_hand():
    # head_dim 8: θ_i = 10000^(-2i/8) = 1, 0.1, 0.01, 0.001; fraction 0.5 keeps 1 and 0.1.
    # Half pairing: dim i pairs with i + 4; pairs 0, 1 turn by 5·1 and 5·0.1, pairs 2, 3 not at all.
    x = torch.arange(1.0, 9.0)
    out = rotate_one(p_rope(8, 0.5), x, 5)
    expected = x.clone()
    for i, angle in ((0, 5.0), (1, 0.5)):
        expected[i] = x[i] * math.cos(angle) - x[i + 4] * math.sin(angle)
        expected[i + 4] = x[i + 4] * math.cos(angle) + x[i] * math.sin(angle)
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.equal(out[[2, 3, 6, 7]], x[[2, 3, 6, 7]])  # frequency 0: exactly the identity


def test_p_rope_differs_from_partial_rotary():
    # rotary_fraction 0.5 rotates dims 0-3 with the frequencies of a 4-dim head, 1 and 0.01;
    # frequency_fraction 0.5 keeps the 8-dim head's 1 and 0.1.
    assert p_rope(8, 0.5).inv_freq.tolist() == pytest.approx([1.0, 0.1, 0.0, 0.0])
    assert rope(8, "half", rotary_fraction=0.5).inv_freq.tolist() == pytest.approx([1.0, 0.01])


def test_p_rope_composes_with_scalings():
    linear = RopeScalingConfig(type="linear", factor=4.0)
    assert p_rope(8, 0.5, linear).inv_freq.tolist() == pytest.approx([0.25, 0.025, 0.0, 0.0])
    yarn = RopeScalingConfig(type="yarn", factor=4.0, original_max_len=16)
    full, kept = p_rope(16, 1.0, yarn), p_rope(16, 0.75, yarn)
    assert torch.equal(kept.inv_freq[:6], full.inv_freq[:6]) and kept.inv_freq[6:].abs().sum() == 0
    assert kept.attention_factor == full.attention_factor
    dynamic = RopeScalingConfig(type="dynamic", factor=4.0, original_max_len=8)
    cos, _ = p_rope(8, 0.5, dynamic).cos_sin(torch.arange(64), fit_len=64)  # refitted frequencies
    assert torch.equal(cos[:, [2, 3, 6, 7]], torch.ones(64, 4))


@pytest.mark.parametrize("fraction, head_dim, kept", [(0.75, 64, 24), (0.3, 16, 2), (0.29, 200, 29), (1.0, 8, 4)])
def test_p_rope_keeps_floor_of_the_fraction(fraction, head_dim, kept):
    assert tiny_config(frequency_fraction=fraction, d_model=head_dim * 4).kept_frequencies == kept
    assert int((p_rope(head_dim, fraction).inv_freq > 0).sum()) == kept


def test_p_rope_model_is_causal():
    model = Transformer(tiny_config(frequency_fraction=0.5)).eval()
    x = torch.randint(0, 97, (2, 20))
    changed = x.clone()
    changed[:, 11] = (changed[:, 11] + 1) % 97
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.equal(a[:, :11], b[:, :11]) and not torch.allclose(a[:, 11:], b[:, 11:])


def test_p_rope_bad_fractions_are_config_errors():
    from ropelab.common.errors import ConfigError
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ConfigError, match=r"frequency_fraction must be in \(0, 1\]"):
            tiny_config(frequency_fraction=bad)
    with pytest.raises(ConfigError, match="keeps none"):
        tiny_config(frequency_fraction=0.2)  # head_dim 8: floor(0.2 · 4) = 0
