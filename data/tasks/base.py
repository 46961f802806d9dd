"""What every synthetic task shares: an instance (tokens + answer mask) and the Task interface.

An instance is one sequence of token ids and a mask of its *answer* tokens, the tokens the
model must predict; training counts only those in the loss and evaluation scores an
instance as correct only if every one of them is predicted exactly. Answers are mostly at
the end (passkey, copy, addition) but may be spread out (recall answers each query where
it is asked).

Length: an instance of length ``n`` has ``n + 1`` tokens, so the model reads ``n``
positions (every token but the last, which is only a target) — the same meaning as a
perplexity window of length ``n``, and what a learned position table must cover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ropelab.common.errors import UserError


class TaskError(UserError):
    """Task parameters that cannot make an instance (e.g. more pairs than fit in the length)."""


@dataclass(frozen=True)
class Instance:
    tokens: np.ndarray  # int64 (n + 1,)
    answer: np.ndarray  # bool (n + 1,): True where the token is an answer the model must predict

    @property
    def length(self) -> int:
        """Positions the model reads: every token but the last."""
        return len(self.tokens) - 1


def assemble(segments: Sequence[tuple[Sequence[int], bool]]) -> Instance:
    """An instance from (token ids, is answer) segments, in order."""
    tokens = np.concatenate([np.asarray(ids, dtype=np.int64) for ids, _ in segments])
    answer = np.concatenate([np.full(len(ids), flag, dtype=bool) for ids, flag in segments])
    return Instance(tokens, answer)


def answer_spans(instance: Instance) -> list[tuple[int, int]]:
    """The (start, end) of each run of consecutive answer tokens, in order."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], instance.answer.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def answer_needles(instance: Instance) -> np.ndarray:
    """Where the text holds what the answers copy: a bool mask (n + 1,) of every occurrence of
    an answer span's tokens before that span, outside the answers. For a needle task
    (``Task.has_depth``) these are the asked needles: passkey's key (twice in its paper
    wording), and with several questions (multikey's ``asked``) each asked needle's value."""
    mask = np.zeros(len(instance.tokens), dtype=bool)
    for start, end in answer_spans(instance):
        for at in copies(instance, start, instance.tokens[start:end]):
            mask[at:at + end - start] = True
    return mask


def copies(instance: Instance, before: int, tokens: np.ndarray) -> np.ndarray:
    """The starts of every occurrence of ``tokens`` in the text before index ``before`` that
    overlaps no answer token, in order."""
    if before < len(tokens) or not len(tokens):
        return np.zeros(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(instance.tokens[:before], len(tokens))
    answers = np.lib.stride_tricks.sliding_window_view(instance.answer[:before], len(tokens)).any(axis=1)
    return np.flatnonzero((windows == tokens).all(axis=1) & ~answers)


def last_copy(instance: Instance, before: int, tokens: np.ndarray) -> Optional[int]:
    """Where ``tokens`` last occur in the text before index ``before``, outside the answers
    (the start of that copy), or None where they do not occur there."""
    found = copies(instance, before, np.asarray(tokens))
    return int(found[-1]) if len(found) else None


def answer_source(instance: Instance, start: int, written: np.ndarray) -> Optional[tuple[int, int]]:
    """Whether a wrong answer was copied from the text: for the answer span at ``start`` and
    the tokens a model wrote over it, (how far back from ``start`` the last copy of what it
    wrote begins, how far back the last copy of the right answer begins), or None where what
    it wrote is nowhere earlier in the text (outside the answers) or the answer is not a copy
    of anything before it. In a needle task the first is another candidate (a distractor,
    another needle's value, another chain's): the wrong one picked, and whether it sits
    nearer the question than the asked needle (a smaller distance) or farther."""
    end = start + len(written)
    needle = last_copy(instance, start, instance.tokens[start:end])
    copied = last_copy(instance, start, np.asarray(written))
    if needle is None or copied is None:
        return None
    return start - copied, start - needle


class Task:
    """A generator of instances. Subclasses set ``name`` and implement ``make`` and
    ``min_length``; their module docstring documents the format and vocabulary."""

    name: str
    has_depth = False  # make() places a needle at ``depth``: scored per (length, depth) cell
    # Each answer span is one of several candidates the prompt holds (where ``chance`` > 0):
    # evaluation checks whether a wrong answer copies another (eval/tasks/answers.py).
    picks = False
    per_position = False  # the answer grows with the length: reports show where its first error falls

    def min_length(self) -> int:
        """The shortest length (positions read) an instance can have."""
        raise NotImplementedError

    def make(self, rng: np.random.Generator, length: int, depth: Optional[float] = None) -> Instance:
        """An instance of ``length`` positions (or the longest the format allows below it),
        drawn from ``rng``. ``depth`` places the needle of a task that ``has_depth``; others ignore it."""
        raise NotImplementedError

    def check_length(self, length: int, what: str = "the requested length") -> None:
        if length < self.min_length():
            raise TaskError(f"{self.describe()} needs at least {self.min_length()} positions, but "
                            f"{what} is {length}: {self.too_short_hint()}")

    @property
    def chance(self) -> float:
        """Exact-match accuracy of a model that has learned the format but not the lookup: one
        that answers with a uniformly drawn one of the candidates a prompt offers (distinct
        numbers of which one is asked), where there are two or more; 0 for tasks whose answer
        is not one of a few candidates (copy, addition, recall, passkey without distractors)."""
        return 0.0

    def describe(self) -> str:
        return f"task {self.name}"

    def too_short_hint(self) -> str:
        return "use longer lengths"
