"""Multi-digit addition, digits least significant first (an arithmetic task of Kazemnejad
et al. 2023; the reversed order follows Lee et al. 2023, "Teaching Arithmetic to Small
Transformers", where it lets each output digit depend on the digits at its own place).

Format: ``a+b=c`` where ``a`` and ``b`` have ``d`` random digits each and ``c = a + b`` is
written with ``d + 1`` digits (the last is the final carry, possibly 0), every number
least significant digit first; ``c`` is the answer. Vocabulary: digits 0–9, ``+``, ``=``.
An instance has ``3d + 3`` tokens; at length ``n`` (positions read), ``d = (n - 2) // 3``.
Example (length 11, 3 digits: 752 + 689 = 1441)::

    257+986=1441
            ^^^^ answer
"""

from __future__ import annotations

import string
from typing import Optional

import numpy as np

from data.tasks.base import Instance, Task, assemble
from data.tokenizers import Tokenizer


class Addition(Task):
    name = "addition"

    def __init__(self, tokenizer: Tokenizer):
        self.digits = np.asarray(tokenizer.encode(string.digits), dtype=np.int64)
        self.plus, self.equals = tokenizer.encode("+"), tokenizer.encode("=")

    def min_length(self) -> int:
        return 5  # "1+2=30": one digit each

    def make(self, rng: np.random.Generator, length: int, depth: Optional[float] = None) -> Instance:
        self.check_length(length)
        d = (length - 2) // 3
        a, b = rng.integers(0, 10, size=d), rng.integers(0, 10, size=d)  # least significant first
        total = a + b
        carry, out = 0, np.zeros(d + 1, dtype=np.int64)
        for i in range(d):
            carry, out[i] = divmod(int(total[i]) + carry, 10)
        out[d] = carry
        return assemble([(self.digits[a], False), (self.plus, False), (self.digits[b], False),
                         (self.equals, False), (self.digits[out], True)])
