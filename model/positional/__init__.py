"""Positional encodings, one registry: ``build_positional(cfg)`` picks by ``pos.kind``.

- base.py: the interface (embed / rotation / bias), the per-forward context, NoPE
- absolute.py: sinusoidal and learned absolute positions
- alibi.py: ALiBi biases
- rope.py: rotary embeddings and their two pairings; rope_scaling.py: PI, NTK, dynamic
  NTK, YaRN and Llama 3 frequencies

The registry's keys are exactly ``model.config.POS_KINDS`` (tests/test_positional.py).
"""

from model.config import ModelConfig
from model.positional.absolute import Learned, Sinusoidal
from model.positional.alibi import ALiBi
from model.positional.base import NoPE, PositionalEncoding, PositionContext
from model.positional.rope import RoPE

ENCODINGS: dict[str, type[PositionalEncoding]] = {
    "rope": RoPE, "sinusoidal": Sinusoidal, "learned": Learned, "alibi": ALiBi, "none": NoPE,
}


def build_positional(cfg: ModelConfig) -> PositionalEncoding:
    """One instance per model, shared by all blocks."""
    return ENCODINGS[cfg.pos.kind](cfg)


__all__ = ["ENCODINGS", "PositionContext", "PositionalEncoding", "build_positional"]
