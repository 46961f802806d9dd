"""Shared helpers: tiny model configs for every positional encoding."""

from __future__ import annotations

import pytest
import torch

from model.config import ModelConfig, PosConfig, RopeConfig, RopeScalingConfig

ALL_KINDS = ["rope", "sinusoidal", "learned", "alibi", "none"]


def tiny_config(kind: str = "rope", *, pairing: str = "half", rotary_fraction: float = 1.0,
                scaling: RopeScalingConfig | None = None, max_len: int = 64, **overrides) -> ModelConfig:
    rope = RopeConfig(pairing=pairing, rotary_fraction=rotary_fraction,
                      scaling=scaling or RopeScalingConfig())
    fields = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
    fields.update(overrides)
    return ModelConfig(pos=PosConfig(kind=kind, max_len=max_len, rope=rope), **fields)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
