"""Needles in a haystack with several needles: RULER's NIAH multi-key and multi-value
(Hsieh et al. 2024, §3), in the plain wording of data/tasks/haystack.py.

- ``multikey``: ``needles`` needles ``name: value. `` with distinct names and values; the
  question asks for one name's value. The other needles are distractors that only the name
  tells apart, so retrieval must match the name, not just find a number. The asked needle
  sits at the depth (``eval.tasks.depths``), the others at random offsets. Example (2
  needles, length 50, depth 0.5)::

      nh: 13687. the grass wq: 37704. is green. wq: 37704
                                                    ^^^^^ answer

  With ``asked`` k > 1 (RULER's NIAH multi-query), k distinct needles are asked one after
  another, ``wq: 37704. nh: 13687``, every answer scored; the first asked sits at the depth.
  ``mixed`` asks a uniformly drawn 1 to k of them in each instance.

- ``multivalue``: ``values`` needles ``name: value. `` with one name and distinct values, at
  random offsets; the question asks for the name and the answer is every value, in the
  order of the text, separated by spaces (RULER scores each value found; exact match asks
  for all of them). Example (2 values, length 50)::

      wq: 56002. the wq: 34280. grass is gwq: 56002 34280
                                              ^^^^^^^^^^^ answer

Vocabulary: lower-case letters (filler and names), digits, space, ``.`` and ``:``.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ropelab.data.tasks.haystack import Haystack, Piece
from ropelab.data.tokenizers import Tokenizer


class Multikey(Haystack):
    name = "multikey"
    has_depth = True
    picks = True

    def __init__(self, tokenizer: Tokenizer, needles: int = 4, digits: int = 5, name_letters: int = 2,
                 asked: int = 1, mixed: bool = False, spaced: bool = True):
        self.check_asked(asked, needles, "needles")
        self.needles, self.asked, self.mixed = needles, asked, mixed
        super().__init__(tokenizer, digits, name_letters, spaced)

    def compose(self, rng: np.random.Generator, depth: Optional[float], questions: int):
        names, values = self.names(rng, self.needles), self.numbers(rng, self.needles)
        order = self.pick_asked(rng, questions, self.needles)
        pieces = [Piece((n, self.colon, v, ". "), depth if i == order[0] else None)
                  for i, (n, v) in enumerate(zip(names, values))]
        return pieces, self.one_after_another([(names[i], (values[i],)) for i in order])

    @property
    def chance(self) -> float:
        return self.chance_of(self.needles)

    def describe(self) -> str:
        return f"multikey with {self.needles} needles{self.asked_wording()}{self.spacing_wording()}"


class Multivalue(Haystack):
    name = "multivalue"

    def __init__(self, tokenizer: Tokenizer, values: int = 4, digits: int = 5, name_letters: int = 2,
                 spaced: bool = True):
        self.values = values
        super().__init__(tokenizer, digits, name_letters, spaced)

    @property
    def chance(self) -> float:
        # every value, in a random order; one value is no choice (Task.chance)
        return 1.0 / math.factorial(self.values) if self.values > 1 else 0.0

    def compose(self, rng: np.random.Generator, depth: Optional[float], questions: int):
        (name,), values = self.names(rng, 1), self.numbers(rng, self.values)
        answer = [part for v in values for part in (" ", v)][1:]
        return [Piece((name, self.colon, v, ". ")) for v in values], [((name, self.colon), tuple(answer))]

    def describe(self) -> str:
        return f"multivalue with {self.values} values{self.spacing_wording()}"
