"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology", §3.1).

Format: ``P`` key–value pairs, then a query region where ``Q`` of the keys are asked
again, each immediately followed by its value (the answer), among filler dots::

    a3k7q1z5..k7....z5.a3..q1
                ^      ^ ^   ^ answers: the value after each queried key

Vocabulary: keys are letters a–z (distinct within an instance, so ``P`` <= 26), values
digits 0–9 (a value may repeat), filler ``.``. The pairs take ``2P`` tokens, each query
2, so an instance needs ``2P + 2Q`` tokens (length ``2P + 2Q - 1``); longer instances
widen the query region, so the distance between a pair and its query grows with the
length. The ``Q`` queried keys are distinct and in random order, at uniformly random
non-overlapping places in the region (Zoology draws the gaps from a power law that
favours short distances; uniform places make distance grow with length, the quantity
this project studies). As in Zoology, only the values after queries are scored, with
teacher forcing: every earlier token, answers included, is given.
"""

from __future__ import annotations

import string
from typing import Optional

import numpy as np

from ropelab.data.tasks.base import Instance, Task
from ropelab.data.tokenizers import Tokenizer


class Recall(Task):
    name = "recall"

    def __init__(self, tokenizer: Tokenizer, pairs: int = 8, queries: Optional[int] = None):
        self.pairs, self.queries = pairs, pairs if queries is None else queries
        self.keys = np.asarray(tokenizer.encode(string.ascii_lowercase), dtype=np.int64)
        self.values = np.asarray(tokenizer.encode(string.digits), dtype=np.int64)
        self.filler = tokenizer.encode(".")[0]

    def min_length(self) -> int:
        return 2 * self.pairs + 2 * self.queries - 1

    def make(self, rng: np.random.Generator, length: int, depth: Optional[float] = None) -> Instance:
        self.check_length(length)
        p, q = self.pairs, self.queries
        keys = rng.choice(self.keys, size=p, replace=False)
        values = self.values[rng.integers(0, len(self.values), size=p)]
        asked = rng.choice(p, size=q, replace=False)
        region = length + 1 - 2 * p
        # Non-overlapping 2-token slots: distinct sorted picks t_i from region - q places,
        # shifted by i, give starts at least 2 apart and at most region - 2.
        starts = np.sort(rng.choice(region - q, size=q, replace=False)) + np.arange(q)
        tokens = np.full(length + 1, self.filler, dtype=np.int64)
        tokens[0:2 * p:2], tokens[1:2 * p:2] = keys, values
        answer = np.zeros(length + 1, dtype=bool)
        at = 2 * p + starts
        tokens[at], tokens[at + 1], answer[at + 1] = keys[asked], values[asked], True
        return Instance(tokens, answer)

    def describe(self) -> str:
        return f"recall with {self.pairs} pairs and {self.queries} queries"

    def too_short_hint(self) -> str:
        return ("the pairs take 2 tokens each and so does every query; use longer lengths or fewer "
                "data.synthetic.pairs / queries")
