"""The network only: config, layers, attention (softmax and linear), KV cache and recurrent
state, positional encodings (``model.positional``), the chunked LM-head loss, generation and
the pure Llama mapping.

Nothing here reads or writes files or knows about run configs, data or training; those
layers sit above (configs < data < training < eval).
"""

from model.config import (ATTENTION_KINDS, POS_KINDS, SCALING_TYPES, LinearAttentionConfig, ModelConfig,
                          PosConfig, RopeConfig, RopeScalingConfig)
from model.transformer import Transformer

__all__ = ["ATTENTION_KINDS", "POS_KINDS", "SCALING_TYPES", "LinearAttentionConfig", "ModelConfig", "PosConfig",
           "RopeConfig", "RopeScalingConfig", "Transformer"]
