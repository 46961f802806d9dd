"""The network only: config, layers, attention, KV cache, positional encodings
(``model.positional``), the chunked LM-head loss, generation and the pure Llama mapping.

Nothing here reads or writes files or knows about run configs, data or training; those
layers sit above (configs < data < training < eval).
"""

from model.config import POS_KINDS, SCALING_TYPES, ModelConfig, PosConfig, RopeConfig, RopeScalingConfig
from model.transformer import Transformer

__all__ = ["POS_KINDS", "SCALING_TYPES", "ModelConfig", "PosConfig", "RopeConfig", "RopeScalingConfig",
           "Transformer"]
