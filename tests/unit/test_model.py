"""The decoder: causality, reference parity, GQA, tying, init and accounting."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.models import ALL_KINDS, PLANS, plan_config, tiny_config
from ropelab.model.config import ModelConfig, PosConfig
from ropelab.common.errors import ConfigError
from ropelab.model.transformer import Transformer
from helpers.reference import assert_causal, reference_dape, reference_forward


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_causal(kind):
    assert_causal(Transformer(tiny_config(kind)).eval())


@pytest.mark.parametrize("plan", list(PLANS))
def test_layer_plans_are_causal(plan):
    assert_causal(Transformer(plan_config(plan)).eval())


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_sdpa_matches_reference(kind, kv_heads):
    model = Transformer(tiny_config(kind, n_kv_heads=kv_heads)).eval()
    x = torch.randint(0, 97, (2, 33))
    with torch.no_grad():
        assert torch.allclose(model(x), reference_forward(model, x), atol=1e-5)


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("kv_heads", [4, 1])
def test_layer_plans_match_the_reference(plan, kv_heads):
    """Each layer's window, sinks, temperature and encoding against their formulas per pair
    (tests/helpers/reference.py reads the plan from the config, not from the model's contexts)."""
    model = Transformer(plan_config(plan, n_kv_heads=kv_heads)).eval()
    with torch.no_grad():  # sinks and SSMax scales away from their init, so a dropped one shows
        for block in model.blocks:
            if block.attn.sinks is not None:
                block.attn.sinks.normal_(0.0, 1.0)
            if block.attn.temperature is not None and hasattr(block.attn.temperature, "scale"):
                block.attn.temperature.scale.uniform_(0.2, 1.0)
        for name, param in model.named_parameters():  # DAPE's MLP, whose output layer starts at 0
            if ".mlps." in name:
                param.normal_(0.0, 0.5)
    x = torch.randint(0, 97, (2, 33))
    with torch.no_grad():
        got, want = model(x), reference_forward(model, x)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("kind", ["none", "alibi"])
def test_attention_by_hand(kind):
    """One head: attention equals softmax(qkᵀ/√d + bias + mask) v written out, fused or chunked."""
    model = Transformer(tiny_config(kind, n_heads=1, n_kv_heads=1, n_layers=1)).eval()
    attn = model.blocks[0].attn
    x = torch.randn(1, 6, 32)
    wq, wk, wv = attn.wqkv.parts()
    q, k, v = x[0] @ wq.T, x[0] @ wk.T, x[0] @ wv.T
    distance = torch.arange(6)[:, None] - torch.arange(6)[None, :]
    bias = -(2.0 ** -8) * distance if kind == "alibi" else torch.zeros(6, 6)  # one head: slope 2^-8
    scores = q @ k.T / math.sqrt(32) + bias + torch.full((6, 6), float("-inf")).triu(1)
    expected = attn.wo(scores.softmax(-1) @ v)
    with torch.no_grad():
        got = attn(x, model.pos.context(torch.arange(6), 6))
    assert torch.allclose(got[0], expected, atol=1e-6)


def test_gqa_shapes_and_params():
    mha = Transformer(tiny_config(n_kv_heads=4))
    gqa = Transformer(tiny_config(n_kv_heads=1))
    assert gqa.blocks[0].attn.wqkv.parts()[1].shape == (8, 32) and gqa.blocks[0].attn.wqkv.weight.shape == (48, 32)
    assert mha.num_params() - gqa.num_params() == 2 * 2 * (32 * 32 - 32 * 8)


def test_tied_and_untied_head():
    tied = Transformer(tiny_config())
    untied = Transformer(tiny_config(tie_embeddings=False))
    assert tied.head.weight is tied.tok_emb.weight
    assert untied.head.weight is not untied.tok_emb.weight
    assert untied.num_params() - tied.num_params() == 97 * 32
    assert tied.num_params(exclude_embeddings=True) == untied.num_params(exclude_embeddings=True) - 97 * 32


def test_no_biases_and_swiglu_width():
    model = Transformer(tiny_config())
    assert all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear))
    # LLaMA: 2/3 · 4 · 32 = 85.3 → rounded up to a multiple of 32 = 96.
    assert model.blocks[0].mlp.w13.weight.shape == (2 * 96, 32)  # gate and up, fused


def test_residual_projections_scaled_by_depth():
    model = Transformer(tiny_config(n_layers=8, d_model=256, n_heads=4, n_kv_heads=4))
    std = 0.02 / math.sqrt(16)
    assert model.blocks[3].attn.wo.weight.std().item() == pytest.approx(std, rel=0.05)
    assert model.blocks[3].mlp.w2.weight.std().item() == pytest.approx(std, rel=0.05)
    assert model.blocks[3].attn.wqkv.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_param_count_and_flops_by_hand():
    cfg = tiny_config("learned", n_kv_heads=4, max_len=64)
    model = Transformer(cfg)
    per_layer = 4 * 32 * 32 + 3 * 32 * 96 + 2 * 32
    assert model.num_params() == 97 * 32 + 64 * 32 + 2 * per_layer + 32
    assert model.num_params(exclude_embeddings=True) == 2 * per_layer + 32
    n_matmul = 2 * (4 * 32 * 32 + 3 * 32 * 96) + 97 * 32
    assert model.flops_per_token(128) == 3 * (2 * n_matmul + 4 * 2 * 32 * 128)
    assert model.flops_per_token(128, training=False) == 2 * n_matmul + 4 * 2 * 32 * 128


def test_loss_at_init_is_near_uniform():
    model = Transformer(tiny_config())
    x = torch.randint(0, 97, (4, 32))
    targets = torch.randint(0, 97, (4, 32))  # unrelated to the inputs
    loss = F.cross_entropy(model(x).flatten(0, 1), targets.flatten())
    assert loss.item() == pytest.approx(math.log(97), rel=0.02)


@pytest.mark.parametrize("fields,match", [
    (dict(d_model=30, n_heads=4), "not divisible by model.n_heads"),
    (dict(n_heads=4, n_kv_heads=3), "not divisible by model.n_kv_heads"),
    (dict(dropout=1.0), "dropout"),
])
def test_config_rejects_impossible_models(fields, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**fields)
    with pytest.raises(ConfigError, match="max_len"):
        PosConfig(kind="learned")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_the_written_out_formula(dtype):
    """The fused norm gives the values and gradients of x·rsqrt(mean(x²) + eps)·w in float32."""
    from ropelab.model.layers import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x = (3 * torch.randn(4, 9, 48)).to(dtype).requires_grad_()
    x32 = x.float()
    written = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype) * norm.weight
    upstream = torch.randn_like(written)
    grads_written = torch.autograd.grad((written * upstream).sum(), (x, norm.weight))
    fused = norm(x)
    grads_fused = torch.autograd.grad((fused * upstream).sum(), (x, norm.weight))
    assert fused.dtype == written.dtype and torch.equal(fused, written)
    for a, b in zip(grads_fused, grads_written):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_first_target_scores_the_same_targets_and_zeros_the_context(kind):
    """Evaluation windows skip the head on context-only positions: the scored targets' NLL is
    the full forward's (to float rounding), the skipped ones read 0 as ignored targets do."""
    model = Transformer(tiny_config(kind, vocab_size=97)).eval()
    x, y = torch.randint(0, 97, (3, 24)), torch.randint(0, 97, (3, 24))
    with torch.no_grad():
        full = model(x, targets=y, reduction="none")
        tail = model(x, targets=y, reduction="none", first_target=10)
    assert tail.shape == full.shape and torch.equal(tail[:, :10], torch.zeros(3, 10))
    torch.testing.assert_close(tail[:, 10:], full[:, 10:], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="first_target"):
        model(x, targets=y, first_target=10)  # a mean over part of the window is not what it means


@pytest.mark.parametrize("tq, tk", [(9, 9), (3, 9), (1, 9)])
def test_dape_mlp_is_the_per_pair_formula_on_every_pair_a_query_sees(tq, tk):
    """A square block (the queries' own keys) gets f on its lower triangle only, 0 above it
    (scores −inf there whatever is added); a block of fewer queries than keys (a cache, a
    later query chunk) gets f on every pair. Masked pairs enter f as A = 0."""
    model = Transformer(tiny_config("dape", n_layers=1))
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.pos.mlps.parameters():
            param.normal_(0.0, 0.5)
    q_pos, k_pos = torch.arange(tk - tq, tk), torch.arange(tk)
    visible = (k_pos[None, :] <= q_pos[:, None])
    logits = torch.randn(2, 4, tq, tk).masked_fill(~visible, float("-inf"))
    bias = model.pos.bias(q_pos, k_pos)
    a = logits.masked_fill(~visible, 0.0)
    want = reference_dape(model.pos.mlps[0], a, bias) - a - bias
    got = model.pos.contextual_bias(0, torch.zeros(2, 4, tq, 8), logits, bias)
    computed = torch.ones(tq, tk, dtype=torch.bool)
    if tq == tk:
        computed = computed.tril()
        assert torch.equal(computed, visible)  # the triangle is exactly what the queries see
    torch.testing.assert_close(got[..., computed], want[..., computed], rtol=1e-5, atol=1e-5)
    assert not got[..., ~computed].any()
