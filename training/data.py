"""What the trainer trains on: one interface over text corpora and synthetic tasks.

``prepare(cfg, rt)`` gives a run's data; anything else with the same three members can
stand in for it (scripts/bench_worker.py trains on random tokens through ``TextData``):

- ``tokenizer``: at least its ``vocab_size``;
- ``train_sampler(seq_len, batch_size, seed, rank, world_size)``: this rank's training
  batches, a sampler with ``next_batch``, ``batches_drawn`` and a ``state_dict`` pair;
- ``validation(seq_len, batch_size, n_batches, world_size)``: the validation loss, a
  function of the model. ``n_batches`` global batches (``batch_size × world_size``
  sequences each), so a run validates on the same data whatever its number of ranks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Union

import numpy as np
from torch import nn

from configs.schema import RunConfig
from common.errors import DataError
from data.prepare import PreparedData, prepare_data
from data.samplers import TrainSampler
from data.tasks import TaskData, TaskSampler
from training.runtime import Runtime
from training.validation import answer_loss, validation_loss

ValidationLoss = Callable[[nn.Module], float]


class TrainingData(Protocol):
    tokenizer: Any

    def train_sampler(self, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                      world_size: int = 1) -> Union[TrainSampler, TaskSampler]: ...

    def validation(self, seq_len: int, batch_size: int, n_batches: int, world_size: int = 1) -> ValidationLoss: ...


@dataclass
class TextData:
    """A text corpus: random windows of ``train``; the loss on the first windows of ``valid``."""

    tokenizer: Any
    train: np.ndarray
    valid: np.ndarray

    @classmethod
    def of(cls, prepared: PreparedData) -> TextData:
        return cls(prepared.tokenizer, prepared.split("train"), prepared.split("valid"))

    def train_sampler(self, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                      world_size: int = 1) -> TrainSampler:
        return TrainSampler(self.train, seq_len, batch_size, seed=seed, rank=rank, world_size=world_size)

    def validation(self, seq_len: int, batch_size: int, n_batches: int, world_size: int = 1) -> ValidationLoss:
        if len(self.valid) < seq_len + 1:  # found now, not at the first validation mid-run
            raise DataError(f"the validation split has {len(self.valid)} tokens, fewer than one window of "
                            f"train.seq_len + 1 = {seq_len + 1}, so training could not validate; give a longer "
                            "validation split (more text in data.local.valid, or a larger data.local.valid_fraction) "
                            "or a shorter train.seq_len")
        # Scored ``batch_size`` windows per forward, as each rank trains.
        return functools.partial(validation_loss, tokens=self.valid, length=seq_len, batch_size=batch_size,
                                 max_windows=n_batches * batch_size * world_size)


class TaskTraining(TaskData):
    """Synthetic tasks: instances made as training draws them; a fixed validation set scored
    on the answer tokens only."""

    def validation(self, seq_len: int, batch_size: int, n_batches: int, world_size: int = 1) -> ValidationLoss:
        batches = self.validation_batches(seq_len, batch_size * world_size, n_batches)
        return functools.partial(answer_loss, batches=batches)


def prepare(cfg: RunConfig, rt: Runtime) -> TrainingData:
    """The run's data: ``cfg.data`` prepared (tokenized once, cached), or its synthetic tasks."""
    if cfg.data.source == "synthetic":  # made on the fly: nothing to tokenize or cache
        return TaskTraining(cfg.data.synthetic)
    # Rank 0 tokenizes; the others wait and then read the cache it wrote.
    if not rt.is_main:
        rt.barrier()
    prepared = prepare_data(cfg.data, progress=cfg.log.progress and rt.is_main)
    if rt.is_main:
        rt.barrier()
    return TextData.of(prepared)
