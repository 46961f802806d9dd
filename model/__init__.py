"""The network only: config, layers, attention (softmax and linear), KV cache and recurrent
state, positional encodings (``model.positional``), the chunked LM-head loss, generation and
the pure Llama mapping.

Nothing here reads or writes files or knows about run configs, data or training; those
layers sit above (configs < data < training < eval).

The package itself imports the configs only, not torch: ``model.config`` and the table of
encodings (``model.encodings``) load without it, for configs and command lines. The network
is ``model.transformer.Transformer``, also reachable as ``ropelab.model.Transformer``: loaded
on first use (PEP 562), so importing the configs still loads no torch.
"""

import importlib

from ropelab.model.config import (ATTENTION_KINDS, POS_KINDS, SCALING_TYPES, LinearAttentionConfig, ModelConfig,
                          PosConfig, RopeConfig, RopeScalingConfig)

__all__ = ["ATTENTION_KINDS", "POS_KINDS", "SCALING_TYPES", "LinearAttentionConfig", "ModelConfig", "PosConfig",
           "RopeConfig", "RopeScalingConfig", "Transformer"]


def __getattr__(name: str):
    if name == "Transformer":  # the network needs torch; the configs above do not
        return importlib.import_module("ropelab.model.transformer").Transformer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
