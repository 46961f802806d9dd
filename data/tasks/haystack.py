"""Retrieval in a haystack: pieces of information laid into filler text, then a question.

The retrieval tasks after RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of
Your Long-Context Language Models?", §3) share this module: multikey, multivalue and
vartrack are ``Haystack`` tasks, and passkey (data/tasks/passkey.py) uses its encoder, its
filler and ``lay`` for its distractors. They are written in one plain wording — lower-case
words, digits and the punctuation ``: . =`` — that both the synthetic task alphabet and a
text run's own tokenizer can write (``data.mix``).

The filler is passkey's, "the grass is green. the sky is blue. the sun is yellow. here we
go. there and back again. " repeated and cut to the length, one stream into which every
piece is laid at an offset (a token of the filler), so pieces may fall mid-word, as
passkey's key sentence does. A piece given a depth d sits at offset ⌊d·room + ½⌋ of the
``room`` filler tokens (0: before all filler, 1: after it); the others at uniformly random
offsets, in the order the task lists them. Every piece and question is tokenized in parts
(names, numbers and punctuation apart), so a number is the same tokens wherever it is
written, whatever the tokenizer.

Numbers have ``key_digits`` digits, the first non-zero; names (``name_letters`` lower-case
letters) never equal a word of the filler. Within an instance, numbers are distinct and so
are names, so every question has exactly one answer.

``spaced`` (data.synthetic.spaced, default true) writes ``name: value`` and ``y = x``; false
writes ``name:value`` and ``y=x``. Spaced, the answer's first token follows a space that
follows ``:``, so finding the asked needle means matching the name two and three tokens
back (2-letter names), where every needle's ``: `` matches; unspaced, the name sits right
before the ``:`` the answer follows, the lookup a previous-token head and an induction head
make (Olsson et al. 2022). Small models trained from scratch on the spaced wording can learn
to copy a value without learning which (docs/tasks.md).
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ropelab.common.errors import DataError
from ropelab.data.tasks.base import Instance, Task, TaskError, assemble
from ropelab.data.tokenizers import Tokenizer

FILLER = "the grass is green. the sky is blue. the sun is yellow. here we go. there and back again. "
FILLER_WORDS = frozenset(FILLER.replace(".", " ").split())
LETTERS = string.ascii_lowercase

Encoder = Callable[[str], list[int]]


def checked_encoder(tokenizer: Tokenizer, what: str) -> Encoder:
    """``tokenizer.encode`` that raises TaskError when it cannot write a prompt's text."""
    def encode(text: str) -> list[int]:
        try:
            ids = tokenizer.encode(text)
        except DataError as e:
            raise TaskError(f"this run's tokenizer cannot write the {what} prompt ({e}); it needs a tokenizer "
                            "that can encode plain English and digits (byte, bpe, or a char vocabulary that "
                            "has every character)") from None
        if not ids:
            raise TaskError(f"this run's tokenizer encodes {text!r} as no tokens; it cannot write the {what} prompt")
        return ids
    return encode


class FillerStream:
    """The first ``n`` tokens of a filler repeated: the first repetition, then ``joiner + filler``."""

    def __init__(self, encode: Encoder, filler: str, joiner: str = ""):
        self._tokens = list(encode(filler))
        self._next = encode(joiner + filler)

    def __call__(self, n: int) -> list[int]:
        while len(self._tokens) < n:
            self._tokens.extend(self._next)
        return self._tokens[:n]


def lay(filler: Sequence[int], pieces: Sequence[tuple[int, list[int]]]) -> list[list[int]]:
    """Segments: ``filler`` cut at each piece's offset (in [0, len(filler)]), the piece between
    the cuts; pieces at one offset keep their order."""
    segments, start = [], 0
    for offset, piece in sorted(pieces, key=lambda p: p[0]):  # sorted() is stable
        segments += [list(filler[start:offset]), piece]
        start = offset
    return segments + [list(filler[start:])]


def number(rng: np.random.Generator, digits: int, avoid: set[str]) -> str:
    """A ``digits``-digit number (first digit non-zero) not in ``avoid``; added to it."""
    while True:
        value = str(rng.integers(10 ** (digits - 1), 10 ** digits))
        if value not in avoid:
            avoid.add(value)
            return value


# A question's parts and its answer's parts: the answer is scored, the question is not.
QA = tuple[tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True)
class Piece:
    """A piece laid into the filler: its parts (each tokenized on its own) and its depth
    (None: a random offset)."""

    parts: tuple[str, ...]
    depth: Optional[float] = None


class Haystack(Task):
    """A retrieval task in filler: subclasses ``compose`` the pieces and the questions with their answers."""

    has_depth = False

    def __init__(self, tokenizer: Tokenizer, digits: int = 5, name_letters: int = 2, spaced: bool = True):
        self.tokenizer, self.digits, self.name_letters, self.spaced = tokenizer, digits, name_letters, spaced
        self.colon, self.equals = (": ", " = ") if spaced else (":", "=")
        self.encode = checked_encoder(tokenizer, self.name)
        self.filler = FillerStream(self.encode, FILLER)

    asked, mixed = 1, False  # questions per instance; mixed: a uniform draw from 1 to ``asked`` each

    def compose(self, rng: np.random.Generator, depth: Optional[float], questions: int) -> tuple[list[Piece], list[QA]]:
        """(pieces in the order of the text, the ``questions`` questions in the order asked, each
        with its answer)."""
        raise NotImplementedError

    def check_asked(self, asked: int, total: int, what: str) -> None:
        """Refuse more questions than there are distinct ``what`` (needles, chains) to ask."""
        if not 1 <= asked <= total:
            raise TaskError(f"{self.name} asks for distinct {what}: data.synthetic.asked={asked} must be in "
                            f"[1, {what}={total}]")

    def questions(self, rng: np.random.Generator) -> int:
        """This instance's number of questions: ``asked``, or with ``mixed`` a uniform draw from 1
        to ``asked``. Asking k questions leaves k - 1 questions' tokens less room for the pieces
        at a length, so training that always asks every needle never puts one where a
        one-question instance of the same length does; mixing the counts covers both layouts
        and still teaches from several answers per instance."""
        return int(rng.integers(1, self.asked + 1)) if self.mixed else self.asked

    def chance_of(self, candidates: int) -> float:
        """``chance`` where the questions ask distinct ones of ``candidates`` values: every answer
        drawn at random without repeats, averaged over the number of questions asked (mixed).
        0 for one candidate (multikey's one needle, RULER's one vartrack chain): there is no
        choice to guess, and no answer without the lookups themselves (Task.chance)."""
        if candidates < 2:
            return 0.0
        counts = range(1, self.asked + 1) if self.mixed else [self.asked]
        return float(np.mean([1.0 / math.perm(candidates, k) for k in counts]))

    def asked_wording(self) -> str:
        """How ``describe`` says the questions: "" for one, ", k asked", ", 1 to k asked"."""
        if self.mixed:
            return f", 1 to {self.asked} asked"
        return f", {self.asked} asked" if self.asked > 1 else ""

    def spacing_wording(self) -> str:
        """How ``describe`` says the wording: "" spaced, ", unspaced" otherwise."""
        return "" if self.spaced else ", unspaced"

    @staticmethod
    def pick_asked(rng: np.random.Generator, asked: int, total: int) -> list[int]:
        """Which of ``total`` needles (chains) the questions ask, in the order asked; one question
        is one draw, as it was before several could be asked."""
        if asked == 1:
            return [int(rng.integers(total))]
        return rng.choice(total, size=asked, replace=False).tolist()

    def one_after_another(self, questions: Sequence[tuple[str, tuple[str, ...]]],
                          mark: Optional[str] = None) -> list[QA]:
        """(name asked, its answer's parts) in the order asked: each later question follows the
        answer before it, "wq: 37704. nh: 13687"; each asked "name" + ``mark`` (the colon)."""
        mark = self.colon if mark is None else mark
        return [((*([". "] if k else []), name, mark), answer) for k, (name, answer) in enumerate(questions)]

    def names(self, rng: np.random.Generator, k: int) -> list[str]:
        """``k`` distinct names, none a word of the filler."""
        out: list[str] = []
        while len(out) < k:
            name = "".join(LETTERS[i] for i in rng.integers(0, 26, size=self.name_letters))
            if name not in out and name not in FILLER_WORDS:
                out.append(name)
        return out

    def numbers(self, rng: np.random.Generator, k: int) -> list[str]:
        taken: set[str] = set()
        return [number(rng, self.digits, taken) for _ in range(k)]

    def _tokens(self, parts: Sequence[str]) -> list[int]:
        return [t for part in parts for t in self.encode(part)]

    def min_length(self) -> int:
        # Every instance has pieces of the same characters counts; a part is at most one token
        # per UTF-8 byte (bytes, chars and byte-level BPE never do worse).
        pieces, asked = self.compose(np.random.default_rng(0), 0.0, self.asked)  # the most questions
        parts = [p for piece in pieces for p in piece.parts] + [p for question, answer in asked for p in question + answer]
        return sum(len(p.encode("utf-8")) for p in parts) - 1

    def make(self, rng: np.random.Generator, length: int, depth: Optional[float] = None) -> Instance:
        self.check_length(length)
        if depth is not None and not 0.0 <= depth <= 1.0:
            raise TaskError(f"a needle's depth must be in [0, 1] (got {depth})")
        pieces, asked = self.compose(rng, depth, self.questions(rng))
        laid = [self._tokens(p.parts) for p in pieces]
        qa = [(self._tokens(question), self._tokens(answer)) for question, answer in asked]
        room = length + 1 - sum(map(len, laid)) - sum(len(q) + len(a) for q, a in qa)
        if room < 0:  # only a tokenizer that breaks the min_length bound gets here
            raise TaskError(f"a {self.name} prompt does not fit in {length} positions")
        random = np.sort(rng.integers(0, room + 1, size=sum(p.depth is None for p in pieces))).tolist()
        offsets = [int(np.floor(p.depth * room + 0.5)) if p.depth is not None else random.pop(0) for p in pieces]
        segments = lay(self.filler(room), list(zip(offsets, laid)))
        return assemble([(s, False) for s in segments] + [seg for q, a in qa for seg in ((q, False), (a, True))])

    def too_short_hint(self) -> str:
        return "the pieces, question and answer without any filler are that long; use longer lengths or fewer pieces"
