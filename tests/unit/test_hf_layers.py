"""One attention layer of a layer plan against transformers' own module for the same layer type.

Where transformers implements a 2025 layer design itself, our layer is compared with it,
weights copied, outputs within 1e-5 on CPU (float32, eager attention):

- Gemma 3 (``Gemma3Attention``): a sliding-window layer at θ_local = 10k and a global layer
  at θ = 1M (also with its linear scaling, as ``PLANS["gemma3"]`` has it), each with the
  cos/sin of its own layer type from ``Gemma3RotaryEmbedding`` and the mask of its type
  from transformers' masking utils.
- gpt-oss (``GptOssAttention``): a sliding-window and a full layer, both with learned
  attention sinks, RoPE θ = 150k in its half-split layout.
- Llama 4 (``Llama4TextAttention``): a RoPE layer (Meta's interleaved, complex rotation) and
  a NoPE layer with its temperature tuning, also run in two chunks through transformers'
  cache, which takes the temperature's positions from the cache's length.

The comparison is at the layer: our ``Attention`` with the context our ``Transformer``
builds for that block (``Transformer.contexts``), against transformers' module fed its own
rotary embedding and mask. Gemma 3 normalises q and k (``q_norm``/``k_norm``, RMSNorm with
1 + weight) and ours has no QK-norm, so those two submodules are replaced by
``nn.Identity`` on transformers' side; ``query_pre_attn_scalar = head_dim`` makes its
scale our 1/√head_dim, and logit soft-capping is off. gpt-oss's projection biases are off
(``attention_bias=False``; ours has none) and its YaRN is replaced by plain RoPE
(``rope_type: default``). Llama 4's QK-norm is off and no chunked attention
(``attention_chunk_size=None``).

Weights are random but decisive (logits with std ≈ 2.5, sinks of either sign, outputs of
order 1) so that a wrong window, base, pairing, sink or temperature shows up far above the
tolerance: each family has negative controls that change one thing on our side and must
miss by more than 1e-3 (``test_*_control``), so no parity test passes vacuously.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ropelab.model.config import (LayerPlan, LayerType, ModelConfig, PosConfig, RopeConfig, RopeScalingConfig,
                                  TemperatureConfig)
from ropelab.model.transformer import Transformer

pytest.importorskip("transformers")

from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask  # noqa: E402

B, T, WINDOW = 2, 40, 8  # T > WINDOW: the sliding layers drop keys
D_MODEL, N_HEADS, N_KV_HEADS, HEAD_DIM = 64, 4, 2, 16  # GQA: two query heads per key/value head
TOL = dict(atol=1e-5, rtol=1e-5)
MISS = 1e-3  # what a negative control must exceed


# --- our side ------------------------------------------------------------------------------------
def rope(theta: float, pairing: str = "half", **scaling) -> PosConfig:
    return PosConfig(rope=RopeConfig(theta=theta, pairing=pairing, scaling=RopeScalingConfig(**scaling)))


def model_config(pos: PosConfig, pattern: str, **types: LayerType) -> ModelConfig:
    return ModelConfig(vocab_size=32, d_model=D_MODEL, n_layers=len(pattern), n_heads=N_HEADS, n_kv_heads=N_KV_HEADS,
                       pos=pos, layers=LayerPlan(pattern=pattern, types=types))


class OurLayer:
    """Block ``layer`` of a Transformer for ``cfg``: its attention, run with the contexts the
    model builds for that block (``Transformer.contexts``)."""

    def __init__(self, cfg: ModelConfig, layer: int, state: dict | None = None):
        """Decisive random weights, or ``state`` (another layer's: a control's same weights)."""
        self.model, self.layer = Transformer(cfg).eval(), layer
        self.attn = attn = self.model.blocks[layer].attn
        if state is not None:
            attn.load_state_dict(state)
            return
        gen = torch.Generator().manual_seed(100 + layer)
        with torch.no_grad():
            wq, wk, wv = attn.wqkv.parts()
            for w, std in ((wq, 0.2), (wk, 0.2), (wv, D_MODEL ** -0.5)):
                w.copy_(torch.randn(w.shape, generator=gen) * std)
            attn.wo.weight.copy_(torch.randn(attn.wo.weight.shape, generator=gen) * D_MODEL ** -0.5)
            if attn.sinks is not None:  # of either sign, so a sink sometimes takes most of the weight
                attn.sinks.copy_(torch.randn(N_HEADS, generator=gen) * 2.0 + 1.0)

    def context(self, lo: int = 0, hi: int = T):
        ctx = self.model.contexts(torch.arange(lo, hi), T, lo)[self.layer]
        assert ctx.layer == self.layer and ctx.window == self.model.cfg.layer_types()[self.layer].window
        return ctx

    def __call__(self, x: torch.Tensor, path: str = "forward") -> torch.Tensor:
        """The layer's output for x (B, T, d) at positions 0 … T−1, by one of its paths:
        ``forward`` (one pass, a single query chunk), ``query-chunks`` (chunks of 16 queries,
        so a window straddles chunk boundaries), ``cached`` (a prefill of 20 tokens, then one
        token at a time through the model's KV cache, a ring of ``window`` slots where the
        layer has one), or ``cached-chunks`` (three uneven chunks through the cache)."""
        spans = {"forward": [(0, T)], "query-chunks": [(0, T)],
                 "cached": [(0, 20)] + [(i, i + 1) for i in range(20, T)],
                 "cached-chunks": [(0, 13), (13, 27), (27, T)]}[path]
        self.attn.query_chunk = 16 if path == "query-chunks" else 512
        if path.startswith("cached"):
            self.model.setup_cache(x.shape[0], T, torch.float32)
        try:
            with torch.no_grad():
                return torch.cat([self.attn(x[:, lo:hi], self.context(lo, hi)) for lo, hi in spans], dim=1)
        finally:
            self.model.clear_cache()
            self.attn.query_chunk = 512


PATHS = ["forward", "query-chunks", "cached", "cached-chunks"]


def copy_weights(ours: OurLayer, hf: nn.Module) -> None:
    """Ours -> transformers': q/k/v rows of the fused projection, the output, the sinks."""
    attn = ours.attn
    with torch.no_grad():
        for name, w in zip(("q_proj", "k_proj", "v_proj"), attn.wqkv.parts()):
            getattr(hf, name).weight.copy_(w)
        hf.o_proj.weight.copy_(attn.wo.weight)
        if attn.sinks is not None:
            hf.sinks.copy_(attn.sinks)


def hidden() -> torch.Tensor:
    return torch.randn(B, T, D_MODEL, generator=torch.Generator().manual_seed(7))


def assert_power(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """The outputs are of order 1, so an absolute 1e-5 is a real test."""
    assert ours.abs().mean() > 0.1 and theirs.abs().mean() > 0.1


def hf_mask(hf_cfg, x: torch.Tensor, sliding: bool) -> torch.Tensor:
    """transformers' own 4-D additive mask for the layer type (eager: materialised)."""
    make = create_sliding_window_causal_mask if sliding else create_causal_mask
    mask = make(config=hf_cfg, inputs_embeds=x, attention_mask=None, cache=None,
                position_ids=torch.arange(x.shape[1])[None])
    assert mask is not None and mask.shape == (x.shape[0], 1, x.shape[1], x.shape[1])
    return mask


# --- Gemma 3 -------------------------------------------------------------------------------------
GEMMA3_LAYERS = {"sliding": 0, "global": 1, "global-linear2": 1}


def gemma3_config(case: str, **local) -> ModelConfig:
    """Ours: layer 0 a window at the default θ 10k, layer 1 global at θ 1M (linear ×2 for
    ``global-linear2``, ``PLANS["gemma3"]``'s global layer)."""
    scaling = dict(type="linear", factor=2.0) if case == "global-linear2" else {}
    return model_config(rope(10000.0), "LG", L=LayerType(pos=rope(10000.0), **{"window": WINDOW, **local}),
                        G=LayerType(pos=rope(1e6, **scaling)))


def gemma3(case: str):
    """transformers' Gemma 3 layer for ``case`` and the inputs its model gives that layer."""
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention, Gemma3RotaryEmbedding

    full = {"rope_type": "default", "rope_theta": 1e6}
    if case == "global-linear2":
        full = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
    cfg = Gemma3TextConfig(vocab_size=32, hidden_size=D_MODEL, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=N_HEADS, num_key_value_heads=N_KV_HEADS, head_dim=HEAD_DIM,
                           query_pre_attn_scalar=HEAD_DIM, sliding_window=WINDOW, attn_logit_softcapping=None,
                           layer_types=["sliding_attention", "full_attention"],
                           rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                            "full_attention": full})
    cfg._attn_implementation = "eager"
    layer = GEMMA3_LAYERS[case]
    attn = Gemma3Attention(cfg, layer).eval()
    attn.q_norm, attn.k_norm = nn.Identity(), nn.Identity()  # ours has no QK-norm
    assert attn.scaling == HEAD_DIM ** -0.5 and attn.sliding_window == (WINDOW if layer == 0 else None)
    x = hidden()
    # As Gemma3TextModel.forward: cos/sin of the layer's type, the mask of its type.
    layer_type = cfg.layer_types[layer]
    cos_sin = Gemma3RotaryEmbedding(cfg)(x, torch.arange(T)[None], layer_type)
    mask = hf_mask(cfg, x, sliding=layer_type == "sliding_attention")
    return attn, x, cos_sin, mask


def paired_outputs(hf, x, position_embeddings, mask, cfg: ModelConfig, layer, ours_cfg: ModelConfig | None,
                   path: str):
    """Our layer with ``hf``'s weights against ``hf`` on ``x``; with ``ours_cfg``, a control: the
    same weights in a layer configured otherwise."""
    ours = OurLayer(cfg, layer)
    copy_weights(ours, hf)
    if ours_cfg is not None:
        ours = OurLayer(ours_cfg, layer, ours.attn.state_dict())
    with torch.no_grad():
        theirs, _ = hf(x, position_embeddings=position_embeddings, attention_mask=mask)
    return ours(x, path), theirs


def gemma3_outputs(case: str, ours_cfg: ModelConfig | None = None, path: str = "forward"):
    hf, x, cos_sin, mask = gemma3(case)
    return paired_outputs(hf, x, cos_sin, mask, gemma3_config(case), GEMMA3_LAYERS[case], ours_cfg, path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", GEMMA3_LAYERS)
def test_gemma3_layers_match_transformers(case, path):
    ours, theirs = gemma3_outputs(case, path=path)
    assert_power(ours, theirs)
    torch.testing.assert_close(ours, theirs, **TOL)


@pytest.mark.parametrize("case, wrong", [
    ("sliding", "window + 1"),  # our window one key wider
    ("sliding", "window - 1"),
    ("global", "local base"),   # the global layer at the local layer's θ
    ("global-linear2", "no scaling"),
])
def test_gemma3_control(case, wrong):
    ours_cfg = {"window + 1": gemma3_config(case, window=WINDOW + 1),
                "window - 1": gemma3_config(case, window=WINDOW - 1),
                "local base": model_config(rope(10000.0), "LG", L=LayerType(pos=rope(10000.0), window=WINDOW),
                                           G=LayerType(pos=rope(10000.0))),
                "no scaling": gemma3_config("global")}[wrong]
    ours, theirs = gemma3_outputs(case, ours_cfg)
    assert (ours - theirs).abs().max() > MISS


# --- gpt-oss -------------------------------------------------------------------------------------
GPT_OSS_LAYERS = {"sliding-sinks": 0, "full-sinks": 1}
GPT_OSS_POS = rope(150000.0)


def gpt_oss_config(window: int | None = WINDOW, sinks: bool = True) -> ModelConfig:
    """Ours: layer 0 a window with sinks, layer 1 full with sinks, RoPE θ 150k half-split."""
    return model_config(GPT_OSS_POS, "LG", L=LayerType(pos=GPT_OSS_POS, window=window, sinks=sinks),
                        G=LayerType(pos=GPT_OSS_POS, sinks=sinks))


def gpt_oss(case: str):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding

    cfg = GptOssConfig(vocab_size=32, hidden_size=D_MODEL, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=N_HEADS, num_key_value_heads=N_KV_HEADS, head_dim=HEAD_DIM,
                       num_local_experts=2, num_experts_per_tok=1, sliding_window=WINDOW, attention_bias=False,
                       layer_types=["sliding_attention", "full_attention"],
                       rope_parameters={"rope_type": "default", "rope_theta": 150000.0})  # no YaRN
    cfg._attn_implementation = "eager"
    layer = GPT_OSS_LAYERS[case]
    attn = GptOssAttention(cfg, layer).eval()
    assert attn.q_proj.bias is None and attn.sliding_window == (WINDOW if layer == 0 else None)
    x = hidden()
    rotary = GptOssRotaryEmbedding(cfg)
    assert rotary.attention_scaling == 1.0
    cos_sin = rotary(x, torch.arange(T)[None])  # (1, T, head_dim/2): _apply_rotary_emb splits halves
    mask = hf_mask(cfg, x, sliding=cfg.layer_types[layer] == "sliding_attention")
    return attn, x, cos_sin, mask


def gpt_oss_outputs(case: str, control: str | None = None, path: str = "forward"):
    hf, x, cos_sin, mask = gpt_oss(case)
    layer = GPT_OSS_LAYERS[case]
    ours = OurLayer(gpt_oss_config(), layer)
    copy_weights(ours, hf)
    assert hf.sinks.abs().min() > 0  # random, non-zero sinks on both sides
    if control == "sinks zeroed":
        with torch.no_grad():
            ours.attn.sinks.zero_()
    elif control == "no sinks":
        state = {k: v for k, v in ours.attn.state_dict().items() if k != "sinks"}
        ours = OurLayer(gpt_oss_config(sinks=False), layer, state)
    elif control == "window + 1":
        ours = OurLayer(gpt_oss_config(window=WINDOW + 1), layer, ours.attn.state_dict())
    with torch.no_grad():
        theirs, _ = hf(x, position_embeddings=cos_sin, attention_mask=mask)
    return ours(x, path), theirs


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", GPT_OSS_LAYERS)
def test_gpt_oss_layers_match_transformers(case, path):
    ours, theirs = gpt_oss_outputs(case, path=path)
    assert_power(ours, theirs)
    torch.testing.assert_close(ours, theirs, **TOL)


@pytest.mark.parametrize("case, control", [("sliding-sinks", "sinks zeroed"), ("full-sinks", "no sinks"),
                                           ("sliding-sinks", "window + 1")])
def test_gpt_oss_control(case, control):
    ours, theirs = gpt_oss_outputs(case, control)
    assert (ours - theirs).abs().max() > MISS


# --- Llama 4 -------------------------------------------------------------------------------------
LLAMA4_LAYERS = {"rope": 0, "nope-temperature": 1}
LLAMA4_THETA, FLOOR_SCALE, ATTN_SCALE = 500000.0, 4, 0.1  # floor 4: the temperature acts from position 3


def llama4_config(pairing: str = "interleaved", temperature: bool = True) -> ModelConfig:
    """Ours: layer 0 RoPE (Meta's interleaved pairs), layer 1 NoPE with Llama 4's temperature."""
    pos = rope(LLAMA4_THETA, pairing)
    tuning = TemperatureConfig(kind="llama4", beta=ATTN_SCALE, floor_scale=FLOOR_SCALE)
    if not temperature:
        tuning = TemperatureConfig()  # kind none
    return model_config(pos, "RN", R=LayerType(pos=pos), N=LayerType(pos=PosConfig(kind="none"), temperature=tuning))


def llama4_hf_config():
    from transformers import Llama4TextConfig

    cfg = Llama4TextConfig(vocab_size=32, hidden_size=D_MODEL, intermediate_size=32, intermediate_size_mlp=32,
                           num_hidden_layers=2, num_attention_heads=N_HEADS, num_key_value_heads=N_KV_HEADS,
                           head_dim=HEAD_DIM, num_local_experts=1, use_qk_norm=False, attention_chunk_size=None,
                           no_rope_layers=[1, 0],  # 1: the layer uses RoPE (transformers' naming)
                           attn_temperature_tuning=True, floor_scale=FLOOR_SCALE, attn_scale=ATTN_SCALE,
                           rope_parameters={"rope_type": "default", "rope_theta": LLAMA4_THETA})
    cfg._attn_implementation = "eager"
    assert cfg.layer_types == ["full_attention", "full_attention"]  # no chunked attention
    return cfg


def llama4(case: str):
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention, Llama4TextRotaryEmbedding

    cfg = llama4_hf_config()
    layer = LLAMA4_LAYERS[case]
    attn = Llama4TextAttention(cfg, layer).eval()
    assert attn.use_rope == (layer == 0) and not hasattr(attn, "qk_norm")
    x = hidden()
    freqs_cis = Llama4TextRotaryEmbedding(cfg)(x, torch.arange(T)[None])  # complex (1, T, head_dim/2)
    return attn, x, freqs_cis, hf_mask(cfg, x, sliding=False)


def llama4_outputs(case: str, ours_cfg: ModelConfig | None = None, path: str = "forward"):
    hf, x, freqs_cis, mask = llama4(case)
    return paired_outputs(hf, x, freqs_cis, mask, llama4_config(), LLAMA4_LAYERS[case], ours_cfg, path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", LLAMA4_LAYERS)
def test_llama4_layers_match_transformers(case, path):
    ours, theirs = llama4_outputs(case, path=path)
    assert_power(ours, theirs)
    torch.testing.assert_close(ours, theirs, **TOL)


@pytest.mark.parametrize("case, control", [("nope-temperature", "no temperature"), ("rope", "half pairing")])
def test_llama4_control(case, control):
    ours_cfg = {"no temperature": llama4_config(temperature=False), "half pairing": llama4_config("half")}[control]
    ours, theirs = llama4_outputs(case, ours_cfg)
    assert (ours - theirs).abs().max() > MISS


def llama4_two_chunks(hf, x: torch.Tensor, freqs_cis: torch.Tensor, split: int, chunk_local: bool = False):
    """transformers' layer over x in two chunks through its DynamicCache: the second chunk's output.
    ``chunk_local``: its cache reports no earlier tokens while the second chunk runs (the keys
    are all there), so the temperature takes the chunk's own indices 0 … as positions."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        for lo, hi in ((0, split), (split, T)):
            # Sized against this layer's cache (layer_idx): only its layer is ever filled.
            mask = create_causal_mask(config=hf.config, inputs_embeds=x[:, lo:hi], attention_mask=None, cache=cache,
                                      position_ids=torch.arange(lo, hi)[None], layer_idx=hf.layer_idx,
                                      allow_is_causal_skip=False)
            if chunk_local and lo:
                cache.get_seq_length = lambda layer_idx=0: 0
            theirs, _ = hf(x[:, lo:hi], position_embeddings=freqs_cis[:, lo:hi], attention_mask=mask, cache=cache)
    assert cache.layers[hf.layer_idx].keys.shape[-2] == T and theirs.shape[1] == T - split
    return theirs


def test_llama4_temperature_positions_through_the_cache():
    """transformers scales a NoPE query by its position taken as the cache's length + its index
    (past_seen_tokens + arange), not from position_ids; fed in two chunks through its
    DynamicCache (a prefill of 24, then 16 tokens at positions 24 … 39), its second chunk
    equals our layer's output at those positions (ours takes them from the context's
    positions), uncached and through our KV cache. Control: with the second chunk's
    temperature at positions 0 … 15 instead, transformers' output misses ours."""
    hf, x, freqs_cis, _ = llama4("nope-temperature")
    ours = OurLayer(llama4_config(), LLAMA4_LAYERS["nope-temperature"])
    copy_weights(ours, hf)
    split = 24
    theirs = llama4_two_chunks(hf, x, freqs_cis, split)
    for path in ("forward", "cached"):
        torch.testing.assert_close(ours(x, path)[:, split:], theirs, **TOL)
    chunk_local = llama4_two_chunks(hf, x, freqs_cis, split, chunk_local=True)
    assert (ours(x)[:, split:] - chunk_local).abs().max() > MISS
