"""Multi-digit addition (an arithmetic task of Kazemnejad et al. 2023), digits least
significant first (as in Lee et al. 2023, "Teaching Arithmetic to Small Transformers"),
in one of two layouts (``data.synthetic.addition_layout``):

- ``aligned`` (default): one group ``a b = c`` per digit place, the sum digit ``c`` (the
  answer) right after the two operand digits of its place, and a last group ``0 0 = c``
  for the final carry. Example, 752 + 689 = 1441 (length 15)::

      29=158=476=400=1
         ^   ^   ^   ^ answers

  A sum digit depends only on its group and the one before (the carry into place i is 1
  exactly when c < a + b in place i - 1), so the rule is local: it tests whether a model
  applies a rule learned at the training positions at every later position. A 2-layer
  model with d_model 128 learned it to 94% exact match at L = 32 in 1,000 steps.
- ``sequential``: ``a+b=c``, the whole sum after both operands, ``a`` and ``b`` with ``d``
  digits, ``c`` with ``d + 1`` (the last is the final carry, possibly 0). Example (length 11)::

      257+986=1441
              ^^^^ answer

  The digits of one place lie ``d + 1`` and ``2d + 2`` tokens back, a distance that grows
  with the length. The tiny models of configs/synthetic-cpu.yaml stayed near chance on it
  (about 2.0 nats per digit, against ln 10 = 2.3) after 2,000 steps at d_model 64 and
  1,750 at d_model 128; it needs larger models or longer training than a CPU grid affords.

Vocabulary: digits 0–9, ``=`` and (sequential) ``+``. Operand digits are uniformly
random, so leading (most significant) zeros occur. An aligned instance has ``4(d + 1)``
tokens, ``d = (n + 1) // 4 - 1`` at length ``n``; a sequential one ``3d + 3``,
``d = (n - 2) // 3``.
"""

from __future__ import annotations

import string
from typing import Optional

import numpy as np

from ropelab.data.tasks.base import Instance, Task, assemble
from ropelab.data.tokenizers import Tokenizer


def digits_of_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The d + 1 digits of a + b for d-digit operands, all least significant first."""
    carry, out = 0, np.zeros(len(a) + 1, dtype=np.int64)
    for i, (x, y) in enumerate(zip(a.tolist(), b.tolist())):
        carry, out[i] = divmod(x + y + carry, 10)
    out[len(a)] = carry
    return out


class Addition(Task):
    name = "addition"
    per_position = True

    def __init__(self, tokenizer: Tokenizer, layout: str = "aligned"):
        self.layout = layout
        self.digits = np.asarray(tokenizer.encode(string.digits), dtype=np.int64)
        self.plus, self.equals = tokenizer.encode("+"), tokenizer.encode("=")

    def min_length(self) -> int:
        return 7 if self.layout == "aligned" else 5  # one digit place: "12=300=0" / "1+2=30"

    def places(self, length: int) -> int:
        return (length + 1) // 4 - 1 if self.layout == "aligned" else (length - 2) // 3

    def make(self, rng: np.random.Generator, length: int, depth: Optional[float] = None) -> Instance:
        self.check_length(length)
        d = self.places(length)
        a, b = rng.integers(0, 10, size=d), rng.integers(0, 10, size=d)  # least significant first
        c = digits_of_sum(a, b)
        if self.layout == "sequential":
            return assemble([(self.digits[a], False), (self.plus, False), (self.digits[b], False),
                             (self.equals, False), (self.digits[c], True)])
        a, b = np.append(a, 0), np.append(b, 0)  # the final carry's place
        groups = np.stack([self.digits[a], self.digits[b], np.full(d + 1, self.equals[0]), self.digits[c]], axis=1)
        answer = np.zeros(groups.shape, dtype=bool)
        answer[:, 3] = True
        return Instance(groups.reshape(-1), answer.reshape(-1))

    def describe(self) -> str:
        return f"addition ({self.layout} layout)"
