"""Synthetic tasks made on the fly: passkey, copy, recall (MQAR), addition.

A synthetic run trains on one or several of them (``data.synthetic.tasks``; each instance's
task is drawn uniformly), on instances made as they are needed (``TaskData``).

Every task writes its instances in one alphabet, ``ALPHABET``, one character per token: a
synthetic run's tokenizer is ``task_tokenizer()``, a CharTokenizer over it (saved as the
run's tokenizer.json like any run's, so sampling and evaluation read it). Each task's
module documents its format and the part of the alphabet it uses; ``TASKS`` maps the
names of ``configs.tasks.TASK_NAMES`` to them.

Runs trained on text can be scored on passkey only, in the paper's own wording tokenized
with the run's tokenizer (``build_task(..., text=True)``); the other tasks exist only in
the task alphabet.
"""

from __future__ import annotations

import difflib
import string

from configs.tasks import TASK_NAMES, SyntheticConfig
from data.tasks.addition import Addition
from data.tasks.base import Instance, Task, TaskError
from data.tasks.batches import TaskSampler, collate, eval_instance, validation_batches
from data.tasks.copy import Copy
from data.tasks.passkey import Passkey
from data.tasks.recall import Recall
from data.tokenizers import CharTokenizer, Tokenizer

# Digits, lower-case letters, and the punctuation of the formats: space . : (passkey),
# > (copy), + = (addition); . is also recall's filler.
ALPHABET = string.digits + string.ascii_lowercase + " .:>+="

TASKS: dict[str, type[Task]] = {"passkey": Passkey, "copy": Copy, "recall": Recall, "addition": Addition}


def task_tokenizer() -> CharTokenizer:
    """The tokenizer of every synthetic run: one id per character of ALPHABET, then <|endoftext|>."""
    return CharTokenizer(ALPHABET)


def check_task_name(name: str) -> None:
    if name not in TASKS:
        close = difflib.get_close_matches(name, list(TASKS), n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise TaskError(f"unknown task {name!r}; {hint}tasks: {', '.join(TASK_NAMES)}")


def check_readable(name: str, text: bool) -> None:
    """Raise TaskError unless ``name`` is a task a run (``text``: trained on text) can be scored on."""
    check_task_name(name)
    if text and name != "passkey":
        raise TaskError(f"task {name} is written in the synthetic task alphabet, which a run trained on "
                        "text never saw; text runs can be scored on passkey only (train on "
                        f"data.source=synthetic data.synthetic.tasks=[{name}] to study {name})")


def build_task(name: str, cfg: SyntheticConfig, tokenizer: Tokenizer, text: bool = False) -> Task:
    """Task ``name`` with the parameters of ``cfg``; ``text`` for runs trained on text."""
    check_readable(name, text)
    if name == "passkey":
        return Passkey(tokenizer, cfg.key_digits, style="text" if text else "symbolic")
    if name == "recall":
        return Recall(tokenizer, cfg.pairs, cfg.n_queries)
    if name == "addition":
        return Addition(tokenizer, cfg.addition_layout)
    return TASKS[name](tokenizer)


class TaskData:
    """A synthetic run's data: the task alphabet's tokenizer, training batches and a validation set.

    What the trainer gets instead of prepared token files; nothing is written or cached.
    """

    def __init__(self, cfg: SyntheticConfig):
        self.cfg = cfg
        self.tokenizer = task_tokenizer()
        self.tasks = [build_task(name, cfg, self.tokenizer) for name in cfg.tasks]

    def train_sampler(self, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                      world_size: int = 1) -> TaskSampler:
        return TaskSampler(self.tasks, seq_len, batch_size, seed, self.tokenizer.eot_id, rank, world_size)

    def validation_batches(self, seq_len: int, batch_size: int, n_batches: int):
        return validation_batches(self.tasks, seq_len, batch_size, n_batches, self.tokenizer.eot_id)


__all__ = ["ALPHABET", "Instance", "TASKS", "Task", "TaskData", "TaskError", "TaskSampler", "build_task",
           "check_readable", "check_task_name", "collate", "eval_instance", "task_tokenizer"]
