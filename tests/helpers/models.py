"""Tiny model configs for every positional encoding, and random models made decisive."""

from __future__ import annotations

import torch

from ropelab.model.config import (POS_KINDS, CopeConfig, LayerPlan, LayerType, ModelConfig, PosConfig, RopeConfig,
                                  RopeScalingConfig, TemperatureConfig)
from ropelab.model.transformer import Transformer

ALL_KINDS = list(POS_KINDS)


def tiny_config(kind: str = "rope", *, pairing: str = "half", rotary_fraction: float = 1.0,
                frequency_fraction: float = 1.0, scaling: RopeScalingConfig | None = None,
                max_len: int = 64, **overrides) -> ModelConfig:
    rope = RopeConfig(pairing=pairing, rotary_fraction=rotary_fraction, frequency_fraction=frequency_fraction,
                      scaling=scaling or RopeScalingConfig())
    fields = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
    fields.update(overrides)
    # CoPE: random embeddings (the paper's zeros would make its bias vanish in every test),
    # and a cap that counts of 20-30 keys reach.
    cope = CopeConfig(max_pos=8, init_std=1.0)
    return ModelConfig(pos=PosConfig(kind=kind, max_len=max_len, rope=rope, cope=cope), **fields)


def _plan(pattern: str, **types: LayerType) -> LayerPlan:
    return LayerPlan(pattern=pattern, types=types)


def _rope(theta: float = 10000.0, **scaling) -> PosConfig:
    return PosConfig(rope=RopeConfig(theta=theta, scaling=RopeScalingConfig(**scaling)))


# Layer plans of the 2025 designs at test size (4 layers, windows of 8 keys, so a 29-token
# prompt is longer than a window), each with the features it mixes: name -> (kind, plan).
PLANS = {
    # NoPE every 4th layer with Llama 4's temperature on it (floor 4, so it acts by position 3).
    "irope": ("rope", _plan("RRRN", R=LayerType(), N=LayerType(
        pos=PosConfig(kind="none"), temperature=TemperatureConfig(kind="llama4", floor_scale=4)))),
    # RNoPE-SWA: sliding-window RoPE layers, a full NoPE layer.
    "rnope-swa": ("rope", _plan("SSSN", S=LayerType(window=8), N=LayerType(pos=PosConfig(kind="none")))),
    # Gemma 3: local layers at θ 10k in a window, a global layer at θ 1M with the scaling.
    "gemma3": ("rope", _plan("LLLG", L=LayerType(window=8), G=LayerType(
        pos=_rope(1e6, type="linear", factor=2.0)))),
    # gpt-oss: alternating windows and full layers, learned sinks on both.
    "gpt-oss": ("rope", _plan("LG", L=LayerType(window=8, sinks=True), G=LayerType(sinks=True))),
    "ssmax": ("rope", _plan("S", S=LayerType(temperature=TemperatureConfig(kind="ssmax", ssmax_init=0.5)))),
    "ssmax-window": ("rope", _plan("SG", S=LayerType(window=8, temperature=TemperatureConfig(kind="ssmax")),
                                   G=LayerType())),
    # A score bias in a window with sinks, and FoX's decay in a window.
    "alibi-window-sinks": ("alibi", _plan("AG", A=LayerType(pos=PosConfig(kind="alibi"), window=8, sinks=True),
                                          G=LayerType(pos=PosConfig(kind="alibi")))),
    "fox-window": ("fox", _plan("FG", F=LayerType(pos=PosConfig(kind="fox"), window=8),
                                G=LayerType(pos=PosConfig(kind="fox")))),
    # DAPE's MLP over logits a temperature has scaled (Llama 4's, floor 4, a strong β so that
    # the order of the two shows), and without one.
    "dape-llama4": ("dape", _plan("DG", D=LayerType(pos=PosConfig(kind="dape"), temperature=TemperatureConfig(
        kind="llama4", floor_scale=4, beta=1.0)), G=LayerType(pos=PosConfig(kind="dape")))),
    # DAPE in a window: its MLP on the pairs of query chunks longer and shorter than their keys.
    "dape-window": ("dape", _plan("DG", D=LayerType(pos=PosConfig(kind="dape"), window=8),
                                  G=LayerType(pos=PosConfig(kind="dape")))),
    "t5-and-rope": ("t5", _plan("TR", T=LayerType(pos=PosConfig(kind="t5")), R=LayerType(pos=PosConfig(kind="rope")))),
}


def plan_config(name: str, **overrides) -> ModelConfig:
    """A tiny 4-layer model with the layer plan ``PLANS[name]`` (its default layer's kind first)."""
    kind, plan = PLANS[name]
    base = tiny_config(kind, n_layers=4, **overrides)
    for layer in plan.types.values():  # the tiny defaults (CoPE's cap, a table size) on each type
        layer.pos.max_len = base.pos.max_len
    return ModelConfig(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, "layers": plan})


def sharp_model(cfg: ModelConfig) -> Transformer:
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sharper attention so a wrong position or mask shows up
        for block in model.blocks:
            wq, wk, _ = block.attn.wqkv.parts()
            wq.mul_(10)
            wk.mul_(10)
    return model
