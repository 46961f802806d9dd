"""Scoring task instances: exact match of every answer token, and where the first error
falls (the answer-only loss the trainer logs is training/validation.py's ``answer_loss``).
Training's competence stop (training/competence.py) and evaluation (eval/tasks/exact_match.py) score
with the same functions.

An instance is correct when, at every answer position, the model's most likely next token
(the argmax of its logits given all earlier tokens of the instance) is the answer token:
teacher forcing, one forward per batch. Where the answer ends the instance (passkey, copy,
addition) this is exactly greedy decoding of the answer: if the first k greedy tokens are
right, step k + 1 sees the teacher-forced prefix, so by induction greedy generation writes
the answer if and only if every teacher-forced argmax is right (tests/integration/test_task_eval.py
checks this against model.generate). Where answers are spread through the sequence
(recall) it is Zoology's protocol: each value is predicted given the true sequence before
it. Ties go to the lowest id, as in greedy decoding.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from ropelab.common.errors import NonFiniteOutput
from ropelab.data.tasks import Instance
from ropelab.data.tasks.base import answer_spans

LOGIT_BUDGET = 1 << 24  # logits held per forward (64 MB of float32): batches shrink with length × vocab


def instances_per_batch(longest: int, vocab: int, max_batch_tokens: int = 16384) -> int:
    """Instances of up to ``longest`` positions scored in one forward (its logits are all held)."""
    return max(1, min(max_batch_tokens // longest, LOGIT_BUDGET // (longest * vocab)))


def _batches(instances: Sequence[Instance], vocab: int, max_batch_tokens: int) -> Iterable[list[Instance]]:
    size = instances_per_batch(max(inst.length for inst in instances), vocab, max_batch_tokens)
    for i in range(0, len(instances), size):
        yield list(instances[i:i + size])


def answer_tokens(instances: Sequence[Instance]) -> np.ndarray:
    """Answer tokens per instance: int (N,)."""
    return np.array([int(inst.answer.sum()) for inst in instances], dtype=np.int64)


def exact_match(model, instances: Sequence[Instance], max_batch_tokens: int = 16384) -> np.ndarray:
    """Whether each instance's answer tokens are all predicted exactly: bool (N,)."""
    return first_errors(model, instances, max_batch_tokens) == answer_tokens(instances)


@torch.no_grad()
def first_errors(model, instances: Sequence[Instance], max_batch_tokens: int = 16384) -> np.ndarray:
    """Per instance, how many of its answer tokens (in order) are right before the first wrong
    one: int (N,), the number of answer tokens where all are right. With teacher forcing this
    is also where greedy decoding of an answer at the end goes wrong first (the argument in
    the module docstring, token by token)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = []
    try:
        for group in _batches(instances, model.cfg.vocab_size, max_batch_tokens):
            longest = max(inst.length for inst in group)
            x = np.zeros((len(group), longest), dtype=np.int64)  # right padding: causal, never scored
            y = np.zeros((len(group), longest), dtype=np.int64)
            scored = np.zeros((len(group), longest), dtype=bool)
            for row, inst in enumerate(group):
                x[row, :inst.length], y[row, :inst.length] = inst.tokens[:-1], inst.tokens[1:]
                scored[row, :inst.length] = inst.answer[1:]
            logits = model(torch.from_numpy(x).to(device))  # (B, T, vocab)
            if not bool(torch.isfinite(logits).all()):  # an argmax of NaN would score 0 as if it were a result
                raise NonFiniteOutput(f"the model's logits at length {longest} are not finite")
            predicted = logits.argmax(dim=-1).cpu().numpy()  # (B, T)
            wrong = (predicted != y) & scored
            # Answer tokens before a position: the running count of scored targets.
            before = np.cumsum(scored, axis=1) - scored
            total = scored.sum(axis=1)
            out.append(np.where(wrong.any(axis=1), before[np.arange(len(group)), wrong.argmax(axis=1)], total))
    finally:
        model.train(was_training)
    return np.concatenate(out)


@torch.no_grad()
def wrong_answers(model, instances: Sequence[Instance], errors: np.ndarray,
                  max_batch_tokens: int = 16384) -> list[Optional[tuple[int, np.ndarray]]]:
    """What the model writes where an instance is wrong: per instance, None where ``errors``
    (``first_errors``) says it is right, else (start, tokens): the answer span in which the
    first error falls (its first token's index in ``inst.tokens``) and the tokens greedy
    decoding writes over that span given the true tokens before it. The tokens before the
    first error are the answer's (teacher forcing has them right); from there each is the
    argmax given those written before it, as ``model.generate`` would write them.

    Instances whose first error falls at the same position are decoded together with the
    model's KV cache: one prefill of the true tokens before it, then one cached step per
    token still to write. The cache is sized to the group's longest instance, so dynamic
    NTK fits its frequencies to the length the scoring forward saw."""
    out: list[Optional[tuple[int, np.ndarray]]] = [None] * len(instances)
    todo = _wrong_spans(instances, errors)
    if not todo:
        return out
    was_training = model.training
    model.eval()
    try:
        for wrong, rows in sorted(todo.items()):
            size = instances_per_batch(max(instances[i].length for i, *_ in rows), model.cfg.vocab_size,
                                       max_batch_tokens)
            for b in range(0, len(rows), size):
                group = rows[b:b + size]
                for (i, start, _), written in zip(group, _decode_from(model, instances, group, wrong)):
                    out[i] = (start, written)
    finally:
        model.clear_cache()
        model.train(was_training)
    return out


def _wrong_spans(instances: Sequence[Instance], errors: np.ndarray) -> dict[int, list[tuple[int, int, int]]]:
    """The wrong instances grouped by the position of their first error: position ->
    [(instance, start, end) of the answer span holding it]."""
    todo: dict[int, list[tuple[int, int, int]]] = {}
    for i, (inst, k) in enumerate(zip(instances, np.asarray(errors).tolist())):
        if k >= int(inst.answer.sum()):
            continue
        for start, end in answer_spans(inst):  # the span holding answer token k (0-based)
            if k < end - start:
                todo.setdefault(start + k, []).append((i, start, end))
                break
            k -= end - start
    return todo


def _decode_from(model, instances: Sequence[Instance], group: list[tuple[int, int, int]],
                 wrong: int) -> list[np.ndarray]:
    """Greedy decoding with the KV cache for instances whose first error falls at ``wrong``:
    one prefill of the true tokens before it, then one cached step per token still to
    write; each instance's span tokens, the true ones before ``wrong``."""
    device = next(model.parameters()).device
    prefix = np.stack([instances[i].tokens[:wrong] for i, *_ in group])
    written = [instances[i].tokens[start:end].copy() for i, start, end in group]
    last = max(end for *_, end in group)
    model.setup_cache(len(group), max(instances[i].length for i, *_ in group))  # replaces the previous group's
    logits = model(torch.from_numpy(prefix).to(device), torch.arange(wrong, device=device))[:, -1]
    for p in range(wrong, last):
        picked = logits.argmax(dim=-1)
        for row, ((_, start, end), token) in enumerate(zip(group, picked.tolist())):
            if p < end:
                written[row][p - start] = token
        if p + 1 < last:
            logits = model(picked[:, None], torch.tensor([p], device=device))[:, -1]
    return written
