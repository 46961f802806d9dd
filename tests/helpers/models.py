"""Tiny model configs for every positional encoding, and random models made decisive."""

from __future__ import annotations

import torch

from ropelab.model.config import POS_KINDS, CopeConfig, ModelConfig, PosConfig, RopeConfig, RopeScalingConfig
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


def sharp_model(cfg: ModelConfig) -> Transformer:
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sharper attention so a wrong position or mask shows up
        for block in model.blocks:
            wq, wk, _ = block.attn.wqkv.parts()
            wq.mul_(10)
            wk.mul_(10)
    return model
