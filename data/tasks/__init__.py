"""Synthetic tasks made on the fly: passkey, copy, recall (MQAR), addition, and RULER's
multikey, multivalue and vartrack (variable tracking).

A synthetic run trains on one or several of them (``data.synthetic.tasks``; each instance's
task is drawn uniformly), on instances made as they are needed (``TaskData``); a text run
may mix the retrieval tasks into its batches (``data.mix``; training/data.py).

Every task writes its instances in one alphabet, ``ALPHABET``, one character per token: a
synthetic run's tokenizer is ``task_tokenizer()``, a CharTokenizer over it (saved as the
run's tokenizer.json like any run's, so sampling and evaluation read it). Each task's
module documents its format and the part of the alphabet it uses; ``TASKS`` maps the
names of ``configs.tasks.TASK_NAMES`` to them.

Runs trained on text can be scored on passkey, in the paper's own wording tokenized with
the run's tokenizer (``build_task(..., text=True)``), and on the retrieval tasks they mixed
into training (``data.mix``), in the plain wording of data/tasks/haystack.py, which is the
task alphabet's; copy, recall and addition exist only in the task alphabet.
"""

from __future__ import annotations

import difflib
import string

from ropelab.configs.tasks import RETRIEVAL_TASKS, TASK_NAMES, SyntheticConfig
from ropelab.data.tasks.addition import Addition
from ropelab.data.tasks.base import Instance, Task, TaskError
from ropelab.data.tasks.batches import TaskSampler, collate, eval_instance, length_set, validation_batches
from ropelab.data.tasks.copy import Copy
from ropelab.data.tasks.niah import Multikey, Multivalue
from ropelab.data.tasks.passkey import Passkey
from ropelab.data.tasks.recall import Recall
from ropelab.data.tasks.vartrack import Vartrack
from ropelab.data.tokenizers import CharTokenizer, Tokenizer

# Digits, lower-case letters, and the punctuation of the formats: space . : (the retrieval
# tasks), > (copy), + = (addition, and vartrack's assignments); . is also recall's filler.
ALPHABET = string.digits + string.ascii_lowercase + " .:>+="

TASKS: dict[str, type[Task]] = {"passkey": Passkey, "copy": Copy, "recall": Recall, "addition": Addition,
                                "multikey": Multikey, "multivalue": Multivalue, "vartrack": Vartrack}


def task_tokenizer() -> CharTokenizer:
    """The tokenizer of every synthetic run: one id per character of ALPHABET, then <|endoftext|>."""
    return CharTokenizer(ALPHABET)


def check_task_name(name: str) -> None:
    if name not in TASKS:
        close = difflib.get_close_matches(name, list(TASKS), n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise TaskError(f"unknown task {name!r}; {hint}tasks: {', '.join(TASK_NAMES)}")


def check_readable(name: str, text: bool) -> None:
    """Raise TaskError unless ``name`` is a task a run can be scored on in the wording ``text``
    (True: a text run trained without ``data.mix``, which reads passkey in the paper's prompt)."""
    check_task_name(name)
    if text and name != "passkey":
        hint = (f"train with data.mix.tasks=[{name}] to score it in the wording it was trained on"
                if name in RETRIEVAL_TASKS else
                f"train on data.source=synthetic data.synthetic.tasks=[{name}] to study {name}")
        raise TaskError(f"task {name} is written in the synthetic task wording, which a run trained on "
                        f"text alone never saw; text runs can be scored on passkey only ({hint})")


def build_task(name: str, cfg: SyntheticConfig, tokenizer: Tokenizer, text: bool = False) -> Task:
    """Task ``name`` with the parameters of ``cfg``; ``text``: passkey in the paper's prompt, for
    runs trained on text alone."""
    check_readable(name, text)
    digits, letters = cfg.key_digits, cfg.name_letters
    if name == "passkey":
        return Passkey(tokenizer, digits, style="text" if text else "symbolic", distractors=cfg.distractors,
                       spaced=text or cfg.spaced)
    if name == "recall":
        return Recall(tokenizer, cfg.pairs, cfg.n_queries)
    if name == "addition":
        return Addition(tokenizer, cfg.addition_layout)
    if name == "multikey":
        return Multikey(tokenizer, cfg.needles, digits, letters, cfg.asked_of(cfg.needles), cfg.asked == "mixed",
                        cfg.spaced)
    if name == "multivalue":
        return Multivalue(tokenizer, cfg.values, digits, letters, cfg.spaced)
    if name == "vartrack":
        return Vartrack(tokenizer, cfg.chains, cfg.hops, digits, letters, cfg.asked_of(cfg.chains), cfg.asked == "mixed",
                        cfg.spaced, cfg.vartrack_answer, cfg.vartrack_question)
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
           "check_readable", "check_task_name", "collate", "eval_instance", "length_set", "task_tokenizer"]
