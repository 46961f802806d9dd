"""Positional encodings, one registry: ``build_positional(cfg)`` picks by ``pos.kind``.

- base.py: the interface (embed / rotation / bias), the per-forward context, NoPE
- absolute.py: sinusoidal and learned absolute positions
- alibi.py: ALiBi biases
- distance.py: biases that depend on the distance only, one table per forward
- t5.py, kerple.py, fire.py: T5's bucketed bias, KERPLE (logarithmic), FIRE
- rope.py: rotary embeddings and their two pairings; rope_scaling.py: PI, NTK, dynamic
  NTK, YaRN and Llama 3 frequencies, and p-RoPE's truncation; xpos.py: xPos
- cope.py: CoPE, contextual positions from gated counts (a bias that depends on q and k)
- fox.py: the Forgetting Transformer's forget gates (a decay from each layer's input)
- dape.py: DAPE, a base bias plus an MLP of each pair's logits and bias

The registry maps each class's ``kind`` to the class; its keys are exactly the rows of
model/encodings.py, and each row agrees with its class (tests/unit/test_positional.py).
"""

from ropelab.model.config import ModelConfig
from ropelab.model.positional.absolute import Learned, Sinusoidal
from ropelab.model.positional.alibi import ALiBi
from ropelab.model.positional.base import NoPE, PositionalEncoding, PositionContext
from ropelab.model.positional.cope import CoPE
from ropelab.model.positional.dape import DAPE
from ropelab.model.positional.fire import Fire
from ropelab.model.positional.fox import ForgetGate
from ropelab.model.positional.kerple import Kerple
from ropelab.model.positional.rope import RoPE
from ropelab.model.positional.t5 import T5Bias
from ropelab.model.positional.xpos import XPos

ENCODINGS: dict[str, type[PositionalEncoding]] = {
    cls.kind: cls for cls in (RoPE, Sinusoidal, Learned, ALiBi, NoPE, T5Bias, Kerple, Fire, XPos, CoPE, ForgetGate, DAPE)
}


def build_positional(cfg: ModelConfig) -> PositionalEncoding:
    """The encoding of ``cfg.pos``: one instance per distinct ``pos`` of a model's layer types."""
    return ENCODINGS[cfg.pos.kind](cfg)


__all__ = ["ENCODINGS", "PositionContext", "PositionalEncoding", "build_positional"]
