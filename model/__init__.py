"""The network: config, blocks, positional encodings, attention, KV cache, generation."""

from model.config import ModelConfig, PosConfig, RopeConfig, RopeScalingConfig
from model.transformer import Transformer

__all__ = ["ModelConfig", "PosConfig", "RopeConfig", "RopeScalingConfig", "Transformer"]
