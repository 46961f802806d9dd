"""What the trainer trains on: one interface over text corpora and synthetic tasks.

``prepare(cfg, rt)`` gives a run's data; anything else with the same three members can
stand in for it (bench/worker.py trains on random tokens through ``TextData``):

- ``tokenizer``: at least its ``vocab_size``;
- ``train_sampler(seq_len, batch_size, seed, rank, world_size)``: this rank's training
  batches, a sampler with ``next_batch``, ``batches_drawn`` and a ``state_dict`` pair;
- ``validation(seq_len, batch_size, n_batches, world_size)``: the validation loss, a
  function of the model. ``n_batches`` global batches (``batch_size × world_size``
  sequences each), so a run validates on the same data whatever its number of ranks.

Synthetic tasks add ``accuracies(seq_len, n, asked, depths)``: each task's exact-match accuracy
at ``seq_len`` on fixed instances, a function of the model (training/competence.py), with
``asked`` questions per multikey/vartrack instance where given (the evaluation's
``eval.tasks.asked``, so competence is judged on what the report scores), else as trained,
and a needle task's instances spread over ``depths`` (the evaluation's ``eval.tasks.depths``). A text
run with ``data.mix`` trains on text windows and retrieval instances in each batch
(``MixedData``), validates on text, and has ``accuracies`` for its mixed tasks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Union

import numpy as np
import torch
from torch import nn

from ropelab.configs.schema import RunConfig
from ropelab.common.errors import DataError
from ropelab.configs.tasks import MixConfig, SyntheticConfig
from ropelab.data.prepare import PreparedData, prepare_data
from ropelab.data.samplers import TrainSampler
from ropelab.data.tasks import Task, TaskData, TaskSampler, build_task, length_set
from ropelab.model.loss import IGNORE_INDEX
from ropelab.training.exact_match import exact_match
from ropelab.training.runtime import Runtime
from ropelab.training.validation import answer_loss, validation_loss

ValidationLoss = Callable[[nn.Module], float]
Accuracies = Callable[[nn.Module], dict[str, float]]


class TrainingData(Protocol):
    tokenizer: Any

    def train_sampler(self, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                      world_size: int = 1) -> Union[TrainSampler, TaskSampler, MixedSampler]: ...

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

    def accuracies(self, seq_len: int, n: int, asked: Optional[int] = None,
                   depths: Optional[list[float]] = None) -> Accuracies:
        return task_accuracies(scored_tasks(self.tasks, self.cfg, self.tokenizer, asked), seq_len, n, depths)


def scored_tasks(tasks: list[Task], synthetic: SyntheticConfig, tokenizer, asked: Optional[int]) -> list[Task]:
    """``tasks`` as the evaluation scores them: with ``asked`` questions per multikey/vartrack
    instance (``eval.tasks.asked``; RULER's multi-key asks one) where that differs from how
    they were trained (``data.synthetic.asked``, e.g. ``mixed``), else ``tasks`` themselves."""
    scored = synthetic.scored_as(asked, [task.name for task in tasks])
    if scored.asked == synthetic.asked:
        return tasks
    return [build_task(task.name, scored, tokenizer) for task in tasks]


def task_accuracies(tasks: list[Task], seq_len: int, n: int, depths: Optional[list[float]] = None) -> Accuracies:
    """model -> {task: exact-match accuracy on its ``n`` fixed instances at ``seq_len``}, a
    needle task's spread over ``depths`` where given (data/tasks/batches.py: ``length_set``;
    the competence stop's check)."""
    sets = {task.name: length_set(task, seq_len, n, depths) for task in tasks}
    return lambda model: {name: float(exact_match(model, instances).mean()) for name, instances in sets.items()}


def mixed_rows(mix: MixConfig, batch_size: int) -> int:
    """Rows of each batch that are task instances (the rest are text windows)."""
    return round(mix.fraction * batch_size)


def mix_weights(targets: torch.Tensor, task_rows: int, share: float) -> torch.Tensor:
    """Per-target loss weights (float32, shaped like ``targets``) of a mixed batch whose last
    ``task_rows`` rows are task instances: the task rows' scored targets share ``share`` of
    the weighted mean (model/loss.py), the text rows' the rest, alike within each group.
    Counted on the device, so no step waits for it."""
    scored = (targets != IGNORE_INDEX).to(torch.float32)
    first_task = targets.shape[0] - task_rows
    text_w = (1.0 - share) / scored[:first_task].sum().clamp_min(1.0)
    task_w = share / scored[first_task:].sum().clamp_min(1.0)
    is_task = (torch.arange(targets.shape[0], device=targets.device) >= first_task)[:, None]
    return torch.where(is_task, task_w, text_w).expand(targets.shape).contiguous()


class MixedSampler:
    """Each batch: the text sampler's windows, then the task sampler's instances (answer
    targets only); both advance together, so the state is both counters. ``loss_share``:
    the task rows' share of the loss (``data.mix.loss_share``; ``target_weights``)."""

    def __init__(self, text: TrainSampler, tasks: TaskSampler, task_rows: int, loss_share: float):
        self.text, self.tasks = text, tasks
        self.task_rows, self.loss_share = task_rows, loss_share

    def target_weights(self, targets: torch.Tensor) -> Optional[torch.Tensor]:
        """This batch's per-target loss weights, or None where it has no task rows (nothing to weigh)."""
        if self.task_rows == 0:
            return None
        return mix_weights(targets, self.task_rows, self.loss_share)

    @property
    def batches_drawn(self) -> int:
        return self.text.batches_drawn

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        (xt, yt), (xk, yk) = self.text.next_batch(), self.tasks.next_batch()
        return torch.cat([xt, xk]), torch.cat([yt, yk])

    def state_dict(self) -> dict:
        return {"text": self.text.state_dict(), "tasks": self.tasks.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.text.load_state_dict(state["text"])
        self.tasks.load_state_dict(state["tasks"])


@dataclass
class MixedData(TextData):
    """A text corpus with retrieval instances in every batch (``data.mix``), written in the
    run's own tokenizer; validation on text alone, so perplexity keeps its meaning."""

    mix: MixConfig = field(default_factory=MixConfig)
    tasks: list[Task] = field(default_factory=list)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)  # how the tasks are built

    @classmethod
    def mixed(cls, prepared: PreparedData, mix: MixConfig, synthetic: SyntheticConfig) -> MixedData:
        tasks = [build_task(name, synthetic, prepared.tokenizer) for name in mix.tasks]
        return cls(prepared.tokenizer, prepared.split("train"), prepared.split("valid"), mix, tasks, synthetic)

    def accuracies(self, seq_len: int, n: int, asked: Optional[int] = None,
                   depths: Optional[list[float]] = None) -> Accuracies:
        return task_accuracies(scored_tasks(self.tasks, self.synthetic, self.tokenizer, asked), seq_len, n, depths)

    def train_sampler(self, seq_len: int, batch_size: int, seed: int, rank: int = 0,
                      world_size: int = 1) -> MixedSampler:
        rows = mixed_rows(self.mix, batch_size)
        text = TrainSampler(self.train, seq_len, batch_size - rows, seed=seed, rank=rank, world_size=world_size)
        tasks = TaskSampler(self.tasks, seq_len, rows, seed, self.tokenizer.eot_id, rank, world_size)
        share = self.mix.loss_share if self.mix.loss_share is not None else rows / batch_size
        return MixedSampler(text, tasks, rows, share)


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
    if cfg.data.mix.tasks:
        return MixedData.mixed(prepared, cfg.data.mix, cfg.data.synthetic)
    return TextData.of(prepared)
