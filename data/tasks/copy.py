"""Copy (Kazemnejad et al. 2023, §3: one of their algorithmic tasks): repeat a random string.

Format: ``s>s`` — a string ``s`` of ``m`` random letters a–z, the marker ``>``, then ``s``
again as the answer. Vocabulary: the 26 letters and ``>``. An instance of length ``n``
(positions read) has ``2m + 1 = n + 1`` tokens when ``n`` is even; for odd ``n`` the string
is one position shorter, ``m = n // 2``. Example (length 10)::

    qwhbx>qwhbx
          ^^^^^ answer (the first copied letter is predicted from ">", so all 5 count)

Exact match asks for the whole copy: one wrong letter and the instance is wrong.
"""

from __future__ import annotations

import string
from typing import Optional

import numpy as np

from ropelab.data.tasks.base import Instance, Task, assemble
from ropelab.data.tokenizers import Tokenizer

LETTERS = string.ascii_lowercase


class Copy(Task):
    name = "copy"
    per_position = True

    def __init__(self, tokenizer: Tokenizer):
        self.letters = np.asarray(tokenizer.encode(LETTERS), dtype=np.int64)
        self.marker = tokenizer.encode(">")

    def min_length(self) -> int:
        return 2  # "a>a"

    def make(self, rng: np.random.Generator, length: int, depth: Optional[float] = None) -> Instance:
        self.check_length(length)
        s = self.letters[rng.integers(0, len(self.letters), size=length // 2)]
        return assemble([(s, False), (self.marker, False), (s, True)])
