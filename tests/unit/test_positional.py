"""Absolute encodings, ALiBi slopes and biases, and what each kind can serve."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.models import ALL_KINDS, tiny_config
from ropelab.model.config import POS_KINDS, RopeScalingConfig
from ropelab.model.encodings import KINDS, served_length
from ropelab.common.errors import ConfigError, LengthError
from ropelab.model.positional import ENCODINGS, build_positional
from ropelab.model.positional.absolute import sinusoid_table
from ropelab.model.positional.alibi import alibi_slopes
from ropelab.model.positional.base import PositionalEncoding
from ropelab.model.transformer import Transformer
from helpers.reference import reference_forward


def test_registry_serves_every_kind_of_the_table():
    assert list(ENCODINGS) == list(POS_KINDS) == list(KINDS)
    for kind in POS_KINDS:
        assert isinstance(build_positional(tiny_config(kind)), ENCODINGS[kind]) and ENCODINGS[kind].kind == kind


@pytest.mark.parametrize("kind", POS_KINDS)
def test_each_row_of_the_table_agrees_with_its_class(kind):
    """What model/encodings.py says of a kind is what its class does."""
    row, cfg = KINDS[kind], tiny_config(kind)
    enc = build_positional(cfg)
    assert enc.has_bias == row.score_bias and enc.contextual == row.contextual
    assert (enc.rotation(torch.arange(4), 4) is not None) == row.rotary
    assert (type(enc).embed is not PositionalEncoding.embed) == row.additive
    assert enc.max_len == served_length(cfg.pos)
    # train.pos_lr_multiplier is refused for kinds without parameters, and acts on ``pos.``.
    names = [n for n, _ in Transformer(cfg).named_parameters()]
    assert any(n.startswith("pos.") for n in names) == row.trained
    assert not any(".pos." in n or n.startswith("blocks.") and "pos" in n for n in names)
    # Spreading the positions apart changes every distance: only kinds that read them notice.
    model, x = Transformer(cfg).eval(), torch.randint(0, 97, (1, 8))
    with torch.no_grad():
        moved = (model(x, positions=torch.arange(8)) - model(x, positions=3 * torch.arange(8))).abs().max()
    assert (moved > 1e-4) == row.takes_positions, float(moved)


@pytest.mark.parametrize("kind", POS_KINDS)
def test_rope_scaling_is_honoured_exactly_where_the_table_allows_it(kind):
    scaling = RopeScalingConfig(type="linear", factor=4.0, original_max_len=8)
    if not KINDS[kind].rope_scaling:
        with pytest.raises(ConfigError, match="scales RoPE's frequencies"):
            tiny_config(kind, scaling=scaling)
        return
    plain = Transformer(tiny_config(kind)).eval()
    scaled = Transformer(tiny_config(kind, scaling=scaling)).eval()
    scaled.load_state_dict(plain.state_dict())
    x = torch.randint(0, 97, (1, 16))
    with torch.no_grad():
        assert (plain(x) - scaled(x)).abs().max() > 1e-4


@pytest.mark.parametrize("kind", [k for k in POS_KINDS if not KINDS[k].rotary])  # rotary: odd dims refused anyway
def test_an_odd_d_model_is_refused_where_dims_pair_up(kind):
    if KINDS[kind].pairs_d_model:
        with pytest.raises(ConfigError, match="even d_model"):
            tiny_config(kind, d_model=33, n_heads=3, n_kv_heads=1)
    else:
        tiny_config(kind, d_model=33, n_heads=3, n_kv_heads=1)


def test_alibi_slopes_power_of_two():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    assert torch.allclose(alibi_slopes(4), torch.tensor([2.0 ** -(2 * (i + 1)) for i in range(4)]))


def test_alibi_slopes_other_head_counts():
    # Paper's rule: 8 slopes of the nearest power of two, then every other slope of 16 heads.
    sixteen = [2.0 ** -(0.5 * (i + 1)) for i in range(16)]
    expected = [2.0 ** -(i + 1) for i in range(8)] + sixteen[0::2][:4]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected))
    assert torch.allclose(alibi_slopes(6)[:4], alibi_slopes(4))
    assert alibi_slopes(6)[4:].tolist() == pytest.approx([2.0 ** -1, 2.0 ** -3])


def test_alibi_bias_is_linear_in_distance():
    model = Transformer(tiny_config("alibi"))
    bias = model.pos.bias(torch.arange(5, 8), torch.arange(8))  # (H, 3, 8)
    slopes = alibi_slopes(4)
    assert bias.shape == (4, 3, 8)
    assert bias[:, 0, 5].abs().max() == 0  # a query attending to itself
    assert torch.allclose(bias[:, 2, 0], -7 * slopes)
    assert torch.allclose(bias[:, 1, 2], -4 * slopes)


def test_sinusoid_table_matches_the_formula():
    table = sinusoid_table(torch.arange(50), 16)
    for pos in (0, 3, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_scales_tokens_by_sqrt_d():
    model = Transformer(tiny_config("sinusoidal"))
    x = torch.randn(1, 3, 32)
    out = model.pos.embed(x, torch.arange(3))
    assert torch.allclose(out, x * math.sqrt(32) + sinusoid_table(torch.arange(3), 32))
    cfg = tiny_config("sinusoidal")
    cfg.pos.token_scale = 1.0  # the ablation: no factor at all
    assert torch.allclose(Transformer(cfg).pos.embed(x, torch.arange(3)), x + sinusoid_table(torch.arange(3), 32))


def test_token_scale_only_for_additive_encodings():
    from ropelab.model.config import PosConfig
    from ropelab.common.errors import ConfigError
    with pytest.raises(ConfigError, match="pos.kind=rope adds none"):
        PosConfig(kind="rope", token_scale=2.0)
    with pytest.raises(ConfigError, match="positive"):
        PosConfig(kind="sinusoidal", token_scale=0.0)


def test_learned_beyond_table_raises_clear_error():
    model = Transformer(tiny_config("learned", max_len=16)).eval()
    model(torch.randint(0, 97, (1, 16)))  # exactly the table is fine
    with pytest.raises(LengthError, match=r"table of 16 positions .*pos.max_len"):
        model(torch.randint(0, 97, (1, 17)))
    with pytest.raises(LengthError, match="16 positions"):
        model(torch.randint(0, 97, (1, 1)), positions=torch.tensor([16]))
    with pytest.raises(LengthError):
        model.setup_cache(1, 17)


@pytest.mark.parametrize("kind", [k for k in ALL_KINDS if k != "learned"])
def test_runs_at_sixteen_times_training_length(kind):
    train_len = 32
    model = Transformer(tiny_config(kind)).eval()
    x = torch.randint(0, 97, (1, 16 * train_len))
    with torch.no_grad():
        logits = model(x)
        assert logits.shape == (1, 512, 97) and torch.isfinite(logits).all()
        # Query-chunked attention (used with biases and caches; later chunks see only the
        # keys up to their last query) equals the one-shot path, fused and reference.
        for block in model.blocks:
            block.attn.query_chunk = 100
        assert torch.allclose(model(x), logits, atol=1e-5)
        assert torch.allclose(reference_forward(model, x), logits, atol=1e-5)


def test_alibi_bias_reaches_the_scores_in_float32_under_autocast(monkeypatch):
    """bf16 would round −slope·distance to one slope step of the slowest head at L=512."""
    model = Transformer(tiny_config("alibi")).to(torch.bfloat16).eval()
    assert model.pos.slopes.dtype == torch.float32  # a bf16 cast leaves the slopes exact
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append((q.dtype, None if attn_mask is None else attn_mask.dtype))
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randint(0, 97, (1, 40)))
    assert out.dtype == torch.bfloat16 and seen
    assert all(dtypes == (torch.float32, torch.float32) for dtypes in seen)
    bias = model.pos.bias(torch.tensor([511]), torch.arange(512))  # (H, 1, 512)
    slowest = bias[-1, 0]
    assert slowest.dtype == torch.float32 and torch.unique(slowest).numel() == 512
