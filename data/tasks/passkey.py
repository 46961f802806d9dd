"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2 and their test script).

A random number (the key) is hidden in repeated filler text and asked for at the end. In
their prompt a task description comes first, then filler, the key sentence "The pass key
is K. Remember it. K is the pass key.", more filler and "What is the pass key? The pass
key is"; the filler is "The grass is green. The sky is blue. The sun is yellow. Here we
go. There and back again." repeated, and both filler parts are prefixes of that
repetition, cut wherever the length requires (they cut characters; we cut tokens). The
lines are joined by newlines. The key has ``digits`` digits, the first non-zero (Chen et
al. 2023 use 5 random digits).

Two wordings, one format:

- ``text``, for runs trained on text: the paper's prompt, word for word, tokenized with
  the run's own tokenizer (answer: " K" after "... The pass key is").
- ``symbolic``, for synthetic runs (the task alphabet, one character per token; see
  data/tasks/__init__.py): no description, lower-case filler "the grass is green. the
  sky is blue. the sun is yellow. here we go. there and back again. ", key sentence
  "key: K. ", question "key: ", answer "K". Example (length 40, depth 0.5)::

      the grass ikey: 48213. the grass iskey: 48213
                                              ^^^^^ answer

The key's depth is the fraction of the filler placed before it: 0 puts it first, 1 right
before the question.

Distractors (``data.synthetic.distractors``, symbolic wording only): that many other
numbers of the key's digits, none equal to the key nor to each other, each written
``N. `` at a random offset of the filler (data/tasks/haystack.py: ``lay``), so a model that
copies "the digits" fails and one that finds the digits after ``key: `` succeeds. Example
(length 50, depth 0.5, 2 distractors)::

    the 67326. 56002. graskey: 86556. the grakey: 86556
                                                  ^^^^^ answer

Unspaced (``data.synthetic.spaced=false``, symbolic wording only): key sentence "key:K. ",
question "key:" (see UNSPACED below).

Every piece is tokenized on its own and the pieces are concatenated;
each boundary (before a space, newline or the key's digits) is a boundary of byte-level
BPE's pre-tokenizer, so this equals tokenizing the whole prompt. The filler absorbs the
key's varying token count, so an instance is exactly the requested length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Optional

import numpy as np

from ropelab.data.tasks.base import Instance, Task, TaskError, answer_needles, assemble
from ropelab.data.tasks.haystack import FILLER, FillerStream, checked_encoder, lay, number
from ropelab.data.tokenizers import Tokenizer

Style = Literal["text", "symbolic"]


@dataclass(frozen=True)
class Wording:
    intro: str  # the task description ("" for none)
    separator: str  # between intro, filler, key sentence, filler and question
    filler: str  # one repetition of the filler; the next repetitions follow `joiner`
    joiner: str
    needle: tuple[str, ...]  # the key sentence's pieces; "{key}" is replaced by the key
    question: str
    answer: str  # "{key}" with what precedes it in the answer


WORDINGS: dict[str, Wording] = {
    "text": Wording(
        intro=("There is an important info hidden inside a lot of irrelevant text. Find it and "
               "memorize them. I will quiz you about the important information there."),
        separator="\n",
        filler="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
        joiner=" ",
        needle=("The pass key is", " {key}", ". Remember it.", " {key}", " is the pass key."),
        question="What is the pass key? The pass key is",
        answer=" {key}"),
    "symbolic": Wording(
        intro="", separator="",
        filler=FILLER,
        joiner="",
        needle=("key: ", "{key}", ". "),
        question="key: ",
        answer="{key}"),
}


# Unspaced (data.synthetic.spaced=false): "key:K. ", question "key:". Spaced, the key's first
# digit follows a space as every distractor's and many filler words do, so finding it means
# matching the ":" two tokens back; unspaced, it follows the only ":" of the text, the
# one-token-back match of an induction head (Olsson et al. 2022), as unspaced multikey does.
UNSPACED = replace(WORDINGS["symbolic"], needle=("key:", "{key}", ". "), question="key:")

DISTRACTOR_END = ". "  # a distractor is a number and this


class Passkey(Task):
    name = "passkey"
    has_depth = True
    picks = True  # among its distractors

    def __init__(self, tokenizer: Tokenizer, digits: int = 5, style: Style = "symbolic", distractors: int = 0,
                 spaced: bool = True):
        if not spaced and style != "symbolic":
            raise TaskError("the unspaced passkey (data.synthetic.spaced=false) is a task wording; the paper's prompt "
                            "(a text run's passkey) is fixed: score text runs with the default data.synthetic.spaced")
        if distractors and style != "symbolic":
            raise TaskError(f"passkey distractors ({distractors}) are written in the task wording; the paper's "
                            "prompt (a text run's passkey) has none: set data.synthetic.distractors=0, or train "
                            "the run with data.mix including passkey to score it in the task wording")
        self.tokenizer, self.digits, self.style, self.distractors = tokenizer, digits, style, distractors
        self.spaced = spaced
        self.wording = w = WORDINGS[style] if spaced else UNSPACED
        self._encode = checked_encoder(tokenizer, "passkey")
        self.intro = self._encode(w.intro) if w.intro else []
        self.sep = self._encode(w.separator) if w.separator else []
        self.question = self._encode(w.question)
        self.filler = FillerStream(self._encode, w.filler, w.joiner)
        self._distractor_end = self._encode(DISTRACTOR_END)

    @property
    def chance(self) -> float:
        return 1.0 / (self.distractors + 1) if self.distractors else 0.0  # the key or a distractor

    def _key_pieces(self, key: str) -> tuple[list[list[int]], list[int]]:
        """(the key sentence's encoded pieces, the encoded answer) for one key."""
        needle = [self._encode(p.format(key=key)) for p in self.wording.needle]
        return needle, self._encode(self.wording.answer.format(key=key))

    def _fixed(self, needle: list[list[int]], answer: list[int]) -> int:
        """Tokens that are not filler: intro, separators (after the intro, around the key
        sentence, before the question), key sentence, question and answer."""
        seps = (4 if self.intro else 3) * len(self.sep)
        return len(self.intro) + seps + sum(map(len, needle)) + len(self.question) + len(answer)

    def min_length(self) -> int:
        # A piece holding the key is at most one token per UTF-8 byte (bytes, chars and
        # byte-level BPE never do worse), whatever the key; the other pieces are fixed.
        key = "9" * self.digits
        needle, answer = self._key_pieces(key)
        keyed = [*self.wording.needle, self.wording.answer]
        worst = [len(p.format(key=key).encode("utf-8")) if "{key}" in p else len(ids)
                 for p, ids in zip(keyed, [*needle, answer])]
        distractors = self.distractors * (len(key.encode("utf-8")) + len(self._distractor_end))
        return self._fixed(needle, answer) - sum(map(len, needle)) - len(answer) + sum(worst) + distractors - 1

    def make(self, rng: np.random.Generator, length: int, depth: Optional[float] = None) -> Instance:
        self.check_length(length)
        depth = rng.random() if depth is None else depth
        if not 0.0 <= depth <= 1.0:
            raise TaskError(f"a passkey depth must be in [0, 1] (got {depth})")
        key = str(rng.integers(10 ** (self.digits - 1), 10 ** self.digits))
        needle, answer = self._key_pieces(key)
        taken = {key}
        distractors = [self._encode(number(rng, self.digits, taken)) + self._distractor_end
                       for _ in range(self.distractors)]
        room = length + 1 - self._fixed(needle, answer) - sum(map(len, distractors))
        if room < 0:  # only a tokenizer that breaks the min_length bound gets here
            raise TaskError(f"the passkey prompt with key {key} does not fit in {length} positions")
        before = int(np.floor(depth * room + 0.5))
        offsets = rng.integers(0, room + 1, size=len(distractors)).tolist() if distractors else []
        # Both filler parts start the filler afresh (the paper's prompt); a distractor's offset
        # counts through both.
        first = lay(self.filler(before), [(o, d) for o, d in zip(offsets, distractors) if o < before])
        second = lay(self.filler(room - before), [(o - before, d) for o, d in zip(offsets, distractors) if o >= before])
        segments = [self.intro, *([self.sep] if self.intro else []), *first, self.sep,
                    *needle, self.sep, *second, self.sep, self.question]
        return assemble([(s, False) for s in segments] + [(answer, True)])

    @staticmethod
    def needle(instance: Instance) -> np.ndarray:
        """Where an instance hid its key: a bool mask (n + 1,) of every occurrence of the
        answer's tokens before the answer. The key sentence writes the key as the answer
        does (once in the symbolic wording, twice in the paper's), each piece tokenized on
        its own, and neither the filler nor the description holds a digit, so these are
        exactly the key's tokens in the key sentence (``answer_needles`` of its one answer span)."""
        return answer_needles(instance)

    def describe(self) -> str:
        extra = f", {self.distractors} distractors" if self.distractors else ""
        extra += "" if self.spaced else ", unspaced"
        return f"passkey ({self.style} wording, {self.digits}-digit keys{extra})"

    def too_short_hint(self) -> str:
        parts = "description, key sentence, question, answer" if self.intro else "key sentence, question, answer"
        return f"the prompt without any filler ({parts}) is that long; use longer lengths"
