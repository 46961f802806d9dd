"""Variable tracking (RULER, Hsieh et al. 2024, §3), in the plain wording of data/tasks/haystack.py.

``chains`` chains of assignments are laid into the filler: chain c starts with
``x = value. `` and continues with ``hops`` assignments ``y = x. ``, ``z = y. ``, …, each
after the one before it in the text; the chains interleave at random. The question names
the last variable of one chain (``z: ``) and the answer is the value its chain started
with, so it takes ``hops`` + 1 lookups, each matching a name, with the other chains as
distractors. Example (2 chains, 1 hop, length 64)::

    the graswq = 25774. sib = 83194.  nh = wq. is gba = ib. ba: 83194
                                                                ^^^^^ answer

(``ba = ib``, ``ib = 83194``; the chain ``nh = wq``, ``wq = 25774`` is the distractor.)

RULER asks instead for every variable that holds a given value; asking for the value of
one variable keeps the answer a fixed number of tokens for exact match.

``answer="chain"`` (data.synthetic.vartrack_answer) answers with the asked variable's chain
back to its value, ``ba: ib = 83194`` above (2 hops: ``z: y = x = 83194``): each name, then
the value, is one lookup (the name just written, found before ``=`` earlier in the text),
as RULER's answer lists a chain's names one after another, where ``answer="value"`` needs
all ``hops`` + 1 lookups before the first answer token. Exact match still takes every hop.

``question="equals"`` (data.synthetic.vartrack_question) asks in the assignments' own form,
``ba = `` instead of ``ba: `` (unspaced ``ba=``): asked ``ba:``, the model must match the name
before ``:`` with the same name before ``=`` in ``ba=ib.`` and answer with the token two on;
asked ``ba=``, the name and the mark are the text's, so the first lookup is the one multikey's
is (``wq:`` finds ``wq:37704``). With the chain answer the whole answer then repeats the
text's assignments, ``ba=ib=83194``, one lookup per hop.

Variables are distinct names of ``name_letters`` letters, the chains' values distinct numbers.
Vocabulary: lower-case letters, digits, space, ``.``, ``=`` and ``:``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ropelab.data.tasks.base import TaskError
from ropelab.data.tasks.haystack import Haystack, Piece
from ropelab.data.tokenizers import Tokenizer


class Vartrack(Haystack):
    name = "vartrack"
    picks = True  # the chains

    def __init__(self, tokenizer: Tokenizer, chains: int = 2, hops: int = 2, digits: int = 5, name_letters: int = 2,
                 asked: int = 1, mixed: bool = False, spaced: bool = True, answer: str = "value",
                 question: str = "colon"):
        self.check_asked(asked, chains, "chains")
        if answer not in ("value", "chain"):
            raise TaskError(f"vartrack answers with the value or the chain (got answer={answer!r})")
        if question not in ("colon", "equals"):
            raise TaskError(f"vartrack asks with a colon or an equals sign (got question={question!r})")
        self.chains, self.hops, self.asked, self.mixed, self.answer = chains, hops, asked, mixed, answer
        self.question = question
        super().__init__(tokenizer, digits, name_letters, spaced)

    def compose(self, rng: np.random.Generator, depth: Optional[float], questions: int):
        per = self.hops + 1
        names, values = self.names(rng, self.chains * per), self.numbers(rng, self.chains)
        chains = [[Piece((names[c * per], self.equals, values[c], ". "))]
                  + [Piece((names[c * per + h], self.equals, names[c * per + h - 1], ". ")) for h in range(1, per)]
                  for c in range(self.chains)]
        order = rng.permutation(np.repeat(np.arange(self.chains), per))  # which chain continues at each step
        pieces = [chains[c].pop(0) for c in order.tolist()]
        asked = self.pick_asked(rng, questions, self.chains)
        held = [names[c * per:(c + 1) * per] for c in asked]  # each asked chain's names, the value's holder first
        mark = self.equals if self.question == "equals" else self.colon
        return pieces, self.one_after_another([(chain[-1], self.answer_of(chain, values[c]))
                                               for chain, c in zip(held, asked)], mark)

    def answer_of(self, chain: list[str], value: str) -> tuple[str, ...]:
        """The answer's parts for the chain's last variable (``chain``: its names, the value's
        holder first): the value, or the chain from the asked variable's source back to the
        value, "y = x = 83194"."""
        if self.answer == "value":
            return (value,)
        return (*(p for name in reversed(chain[:-1]) for p in (name, self.equals)), value)

    @property
    def chance(self) -> float:
        # the chain as answer too: a first name drawn from the chains' sources picks a chain and the
        # rest can follow from it (a draw from every name in the text would do worse)
        return self.chance_of(self.chains)

    def describe(self) -> str:
        answered = ", answered with the chain" if self.answer == "chain" else ""
        form = ", asked in the assignments' form" if self.question == "equals" else ""
        return (f"vartrack with {self.chains} chains of {self.hops} hops{self.asked_wording()}{self.spacing_wording()}"
                f"{answered}{form}")
