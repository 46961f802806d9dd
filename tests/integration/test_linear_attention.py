"""Linear attention: chunked == recurrent == the formula, relative positions, causality,
GQA, cached generation, the denominator guard, FLOPs, memory and refused configurations."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ropelab import train
from helpers.models import tiny_config
from helpers.runs import write_run_config
from ropelab.configs.schema import EvalConfig
from ropelab.eval.lm.extrapolation import run_extrapolation
from ropelab.eval.reporting.labels import label_groups, with_scaling
from ropelab.model.config import ATTENTION_KINDS, POS_KINDS, LinearAttentionConfig, ModelConfig, PosConfig, RopeScalingConfig
from ropelab.model.encodings import kinds_where
from ropelab.common.errors import ConfigError, LengthError
from ropelab.model.generate import generate
from ropelab.model.linear_attention import MIN_COSINE, chunked_linear_attention, recurrent_linear_attention
from ropelab.model.llama_mapping import HFConversionError, check_exportable
from ropelab.model.transformer import ATTENTIONS, Transformer
from helpers.reference import assert_causal, cached_logits, project_heads
from ropelab.training.saved_run import load_run

USABLE_KINDS = [k for k in POS_KINDS if k not in kinds_where("forms_scores")]


def linear_config(kind: str = "rope", feature_map: str = "elu", **kw) -> ModelConfig:
    cfg = tiny_config(kind, attention="linear", **kw)
    cfg.linear_attention.feature_map = feature_map
    return cfg


VARIANTS = {kind: linear_config(kind) for kind in USABLE_KINDS}
VARIANTS.update({
    "rope-interleaved-partial": linear_config(pairing="interleaved", rotary_fraction=0.5),
    "rope-mha": linear_config(n_kv_heads=4),
    "rope-mqa": linear_config(n_kv_heads=1),
    "rope-ntk": linear_config(scaling=RopeScalingConfig(type="ntk", factor=4, original_max_len=8)),
    "rope-yarn": linear_config(scaling=RopeScalingConfig(type="yarn", factor=4, original_max_len=8)),
    "rope-dynamic": linear_config(scaling=RopeScalingConfig(type="dynamic", factor=4, original_max_len=8)),
    "rope-relu": linear_config(feature_map="relu"),
})


# --------------------------------------------------------------------- the formula, by hand

def phi(x: torch.Tensor, feature_map: str) -> torch.Tensor:
    """elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise (Katharopoulos et al. 2020, eq. 7); relu."""
    if feature_map == "relu":
        return x.clamp_min(0)
    return torch.where(x > 0, x + 1, torch.exp(x))


def formula(fq, fk, rq, rk, v):
    """RoFormer eq. 19 with a causal mask, O(T²): y_i = Σ_j≤i (R_iφq_i)ᵀ(R_jφk_j) v_j / Σ_j≤i φq_iᵀφk_j.

    (…, T, D) inputs with k/v already expanded to the query heads.
    """
    mask = torch.ones(fq.shape[-2], fk.shape[-2], dtype=torch.bool).tril()
    numerator = ((rq @ rk.transpose(-2, -1)) * mask) @ v
    denominator = ((fq @ fk.transpose(-2, -1)) * mask).sum(-1, keepdim=True)
    return numerator / denominator


def reference_forward(model: Transformer, idx: torch.Tensor, positions=None) -> torch.Tensor:
    """Logits of ``model`` with linear attention computed from the formula (shares the
    embeddings, norms, MLPs and the encoding's rotation, tested on their own)."""
    B, T = idx.shape
    positions = torch.arange(T) if positions is None else positions
    ctx = model.pos.context(positions, int(positions.max()) + 1)
    feature_map = model.cfg.linear_attention.feature_map
    x = model.pos.embed(model.tok_emb(idx), positions)
    for block in model.blocks:
        attn = block.attn
        h = block.attn_norm(x)
        q, k, v = project_heads(attn, h)
        groups = attn.n_heads // attn.n_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        fq, fk = phi(q, feature_map), phi(k, feature_map)
        rq, rk = ctx.rotate(fq, fk)
        y = formula(fq, fk, rq, rk, v)
        x = x + attn.wo(y.transpose(1, 2).reshape(B, T, -1))
        x = x + block.mlp(block.mlp_norm(x))
    return model.head(model.norm(x))


def set_chunk(model: Transformer, chunk: int) -> Transformer:
    for block in model.blocks:
        block.attn.chunk_size = chunk
    return model


def test_registry_serves_every_attention_kind():
    assert set(ATTENTIONS) == set(ATTENTION_KINDS)
    for kind in ATTENTION_KINDS:
        assert isinstance(Transformer(tiny_config(attention=kind)).blocks[0].attn, ATTENTIONS[kind])


# --------------------------------------------------------------------- the two forms

@pytest.mark.parametrize("feature_map", ["elu", "relu"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("chunk", [1, 8, 29, 64])
def test_chunked_and_recurrent_equal_the_formula(feature_map, kv_heads, chunk):
    B, H, T, D = 2, 4, 29, 8
    G = H // kv_heads
    shift = 1.0 if feature_map == "relu" else 0.0  # keeps relu's φ(q)ᵀφ(k) off 0, clear of the guard
    q, k, v = torch.randn(B, H, T, D) + shift, torch.randn(B, kv_heads, T, D) + shift, torch.randn(B, kv_heads, T, D)
    fq, fk = phi(q, feature_map), phi(k, feature_map)
    rope = Transformer(tiny_config(d_model=32, n_heads=4, n_kv_heads=kv_heads)).pos  # head_dim 8
    rq, rk = rope.rotation(torch.arange(T))(fq, fk)
    expected = formula(fq, fk.repeat_interleave(G, 1), rq, rk.repeat_interleave(G, 1), v.repeat_interleave(G, 1))
    grouped = [t.view(B, kv_heads, G, T, D) for t in (fq, rq)]  # (B, Hkv, G, T, D)
    chunked, state = chunked_linear_attention(grouped[0], fk, grouped[1], rk, v, chunk)
    recurrent, rec_state = recurrent_linear_attention(grouped[0], fk, grouped[1], rk, v)
    assert torch.allclose(chunked.view(B, H, T, D), expected, atol=1e-5)
    assert torch.allclose(recurrent.view(B, H, T, D), expected, atol=1e-5)
    for a, b in zip(state, rec_state):  # the final states agree too (chunked prefill → decoding)
        assert torch.allclose(a, b, atol=1e-5)
    # Continuing from a state equals one pass over the whole sequence.
    first, state = chunked_linear_attention(*(t[..., :11, :] for t in (*grouped[:1], fk, grouped[1], rk, v)), chunk)
    rest, _ = recurrent_linear_attention(*(t[..., 11:, :] for t in (*grouped[:1], fk, grouped[1], rk, v)), state)
    assert torch.allclose(torch.cat((first, rest), dim=3), chunked, atol=1e-5)


# relu's φ(q) is exactly 0 for some heads and positions at init: 0/0 in the formula, the
# guard's case (test_denominator_guard_bounds_the_output); the core test covers relu.
@pytest.mark.parametrize("name", [name for name in VARIANTS if name != "rope-relu"])
def test_model_matches_the_formula_for_any_chunk(name):
    model = Transformer(VARIANTS[name]).eval()
    x = torch.randint(0, 97, (2, 45))
    with torch.no_grad():
        expected = reference_forward(model, x)
        for chunk in (64, 16, 7):
            assert torch.allclose(set_chunk(model, chunk)(x), expected, atol=1e-5), chunk


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_cached_decoding_equals_full_forward(name, chunk):
    model = set_chunk(Transformer(VARIANTS[name]).eval(), 8)
    x = torch.randint(0, 97, (2, 29))
    with torch.no_grad():
        assert torch.allclose(cached_logits(model, x, chunk), model(x), atol=1e-5)


@pytest.mark.parametrize("name", ["rope", "none", "rope-mqa", "rope-yarn"])
def test_greedy_identical_with_and_without_the_state(name):
    model = Transformer(VARIANTS[name]).eval()
    prompt = torch.randint(0, 97, (2, 7))
    with_state = generate(model, prompt, 20, temperature=0)
    assert torch.equal(with_state, generate(model, prompt, 20, temperature=0, use_cache=False))
    assert torch.equal(with_state, generate(model, prompt, 20, temperature=0, prefill_chunk=3))
    assert model.blocks[0].attn.cache is None


def test_state_is_constant_size_float32_per_kv_head():
    model = Transformer(linear_config(n_kv_heads=2)).to(torch.bfloat16)
    sizes = []
    for max_len in (8, 100_000):
        model.setup_cache(3, max_len)
        state = model.blocks[0].attn.cache
        assert state.kv.shape == (3, 2, 8, 8) and state.k_sum.shape == (3, 2, 8)  # (B, Hkv, D, D), (B, Hkv, D)
        assert state.kv.dtype == state.k_sum.dtype == torch.float32
        assert model.cache_max_len() == max_len  # dynamic NTK fits its frequencies to it
        sizes.append(sum(b.numel() for b in state.buffers()))
        model.clear_cache()
    assert sizes[0] == sizes[1]


def test_state_refuses_positions_out_of_order_or_beyond_its_length():
    model = Transformer(linear_config()).eval()
    model.setup_cache(1, 8)
    try:
        model(torch.zeros(1, 3, dtype=torch.long), torch.arange(3))
        with pytest.raises(ValueError, match="continue at 3"):
            model(torch.zeros(1, 1, dtype=torch.long), torch.tensor([1]))  # a sum cannot be rewritten
        with pytest.raises(LengthError, match="set up for 8 positions"):
            model(torch.zeros(1, 6, dtype=torch.long), torch.arange(3, 9))
    finally:
        model.clear_cache()


# --------------------------------------------------------------------- properties

@pytest.mark.parametrize("name", ["rope", "rope-interleaved-partial", "rope-ntk", "rope-mqa", "none"])
def test_output_depends_on_relative_positions_only(name):
    """Only R_iᵀR_j = R_{j−i} enters (the denominator has no positions): shifting every
    position leaves the output unchanged, while other spacings change it (RoPE)."""
    model = Transformer(VARIANTS[name]).eval()
    x = torch.randint(0, 97, (2, 24))
    with torch.no_grad():
        base = model(x)
        shifted = model(x, torch.arange(24) + 37)
        spread = model(x, torch.arange(24) * 2)
    assert torch.allclose(shifted, base, atol=1e-4)
    assert torch.allclose(spread, base, atol=1e-4) == (name == "none")


@pytest.mark.parametrize("name", ["rope", "sinusoidal", "rope-mqa"])
def test_causal(name):
    assert_causal(set_chunk(Transformer(VARIANTS[name]).eval(), 8))


def test_gradients_match_the_formula():
    model = set_chunk(Transformer(VARIANTS["rope-mqa"]), 8)
    x = torch.randint(0, 97, (2, 21))
    grads = []
    for forward in (model, lambda idx: reference_forward(model, idx)):
        model.zero_grad()
        forward(x).logsumexp(-1).mean().backward()
        grads.append(model.blocks[0].attn.wqkv.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_memory_grows_linearly_with_length():
    """No tensor as large as T × T: the largest intermediate doubles when T doubles."""

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.numel = max(getattr(self, "numel", 0), t.numel())
            return out

    model = Transformer(linear_config(n_heads=2, n_kv_heads=1, vocab_size=16)).eval()
    largest = []
    for T in (1024, 2048):
        with torch.no_grad(), Largest() as mode:
            model(torch.zeros(1, T, dtype=torch.long))
        largest.append(mode.numel)
    assert largest[1] <= 2 * largest[0] and largest[1] < 2048 * 2048 / 8


def test_denominator_guard_bounds_the_output():
    """relu features with disjoint supports: φ(q)ᵀφ(k) = 0 while the rotated numerator is not."""
    B, T, D = 1, 6, 8
    fq = torch.zeros(B, 1, 1, T, D)
    fq[..., : D // 2] = 1.0  # dims 0-3
    fk = torch.zeros(B, 1, T, D)
    fk[..., D // 2:] = 1.0  # dims 4-7: half pairing rotates dim i with i + 4
    v = torch.randn(B, 1, T, D)
    rope = Transformer(tiny_config(d_model=32, n_heads=4)).pos
    rq, rk = rope.rotation(torch.arange(T))(fq, fk)
    chunked, _ = chunked_linear_attention(fq, fk, rq, rk, v, 4)
    recurrent, _ = recurrent_linear_attention(fq, fk, rq, rk, v)
    numerator = ((rq[:, :, 0] @ rk.transpose(-2, -1)).tril() @ v)[:, :, None]  # (B, 1, 1, T, D)
    z = fk.cumsum(2)[:, :, None]
    floor = MIN_COSINE * fq.norm(dim=-1, keepdim=True) * z.norm(dim=-1, keepdim=True)
    assert numerator[..., 1:, :].abs().max() > 0.1  # the unguarded quotient would be infinite
    assert torch.allclose(chunked, numerator / floor, atol=1e-3) and torch.allclose(recurrent, chunked, atol=1e-3)
    assert chunked.abs().max() <= math.sqrt(D) / MIN_COSINE * v.norm(dim=-1).max()
    zero_q, _ = chunked_linear_attention(torch.zeros_like(fq), fk, torch.zeros_like(rq), rk, v, 4)
    assert torch.equal(zero_q, torch.zeros_like(zero_q))  # no 0/0


def test_bf16_autocast_forward_and_backward_are_finite():
    model = Transformer(VARIANTS["rope"])
    x = torch.randint(0, 97, (2, 40))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    logits.float().logsumexp(-1).mean().backward()
    assert torch.isfinite(logits).all() and torch.isfinite(model.blocks[0].attn.wqkv.weight.grad).all()
    with torch.no_grad():
        assert (logits.float() - model(x)).abs().max() < 0.1


def test_flops_by_hand():
    model = Transformer(linear_config(n_kv_heads=2))  # d 32, 4 heads of 8, 2 kv heads, 2 layers
    n_matmul = 2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 96) + 97 * 32  # wq wo, wk wv, MLP; head
    per_layer = lambda C: 4 * (4 * C * 8 + 2 * 8 * 8 + 2 * 8) + 2 * 2 * 8 * 8  # noqa: E731
    assert model.flops_per_token(128) == 3 * (2 * n_matmul + 2 * per_layer(64))
    assert model.flops_per_token(4096, training=False) == 2 * n_matmul + 2 * per_layer(64)  # flat in T
    assert model.flops_per_token(16, training=False) == 2 * n_matmul + 2 * per_layer(16)  # one short chunk


# --------------------------------------------------------------------- refused before any work

@pytest.mark.parametrize("kind", kinds_where("forms_scores"))
def test_score_bias_encodings_are_refused(kind):
    with pytest.raises(ConfigError, match="no attention matrix to bias"):
        ModelConfig(attention="linear", pos=PosConfig(kind=kind))


def test_unknown_feature_map_and_dropout_are_refused(tmp_path, corpus):
    with pytest.raises(ConfigError, match="elu, relu"):
        LinearAttentionConfig(feature_map="softmax")  # built in Python, past the loader's check
    with pytest.raises(ConfigError, match="never forms"):
        ModelConfig(attention="linear", dropout=0.1)
    ModelConfig(attention="softmax", dropout=0.1)  # softmax attention honours it
    cfg = write_run_config(tmp_path, corpus)
    for override, message in (("model.pos.kind=alibi", "no attention matrix to bias"),
                              ("model.linear_attention.feature_map=gelu", "'elu', 'relu'"),
                              ("model.dropout=0.1", "cannot be honoured")):
        assert train.main([str(cfg), "model.attention=linear", override]) == 2
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()  # before any work


def test_hf_export_refuses_linear_attention():
    with pytest.raises(HFConversionError, match="linear attention"):
        check_exportable(linear_config())


def test_trains_samples_and_evaluates(tmp_path, corpus):
    cfg = write_run_config(tmp_path, corpus)
    assert train.main([str(cfg), "model.attention=linear", "train.max_steps=20"]) == 0
    run_dir = tmp_path / "runs" / "tiny"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0] - 0.5
    model = load_run(run_dir).model
    assert isinstance(model.blocks[0].attn, ATTENTIONS["linear"])
    assert generate(model, [1, 2, 3], 10, temperature=0).shape == (1, 13)
    ev = EvalConfig(lengths=[16, 64], scalings=["none", "yarn"], max_tokens=512)
    evaluate = lambda: run_extrapolation([run_dir], tmp_path / "report", lambda cfg: ev)  # noqa: E731
    first = evaluate()
    assert all(r["status"] == "ok" and math.isfinite(r["ppl"]) for r in first["results"])
    assert "rope (linear attention) + yarn" in (tmp_path / "report" / "report.md").read_text()
    # A cached evaluation from before a config key existed carries a stale group; reuse refreshes it.
    cache = next((run_dir / "eval").glob("extrapolation*.json"))
    cached = json.loads(cache.read_text())
    cached["meta"]["group"] = "stale"
    cache.write_text(json.dumps(cached))
    assert evaluate()["runs"][0]["group"] == first["runs"][0]["group"]


def test_reports_name_the_attention_kind():
    runs = [{"run": f"r{i}", "encoding": "rope", "attention": attention, "group": attention, "stem": "x"}
            for i, attention in enumerate(("softmax", "linear"))]
    runs.append({"run": "old", "encoding": "none", "group": "g", "stem": "y"})  # cached before attention kinds
    rows = [{"run": run["run"]} for run in runs]
    label_groups(runs, rows)
    assert [row["label"] for row in rows] == ["rope", "rope (linear attention)", "nope"]
    # Linear *scaling* (Position Interpolation) must not read like linear attention.
    assert with_scaling("rope", "linear") == "rope + linear (PI)"
    assert with_scaling("rope (linear attention)", "yarn") == "rope (linear attention) + yarn"
    assert with_scaling("rope", "none") == "rope"
