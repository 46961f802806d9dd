"""Task instances as training and validation batches, and the seeded streams they come from.

Every instance is drawn from its own generator, seeded by what identifies it, so nothing
depends on the order or the process that draws it:

- training: instance ``j`` of global batch ``k`` from ``(TRAIN, train.seed, k, j)``; rank
  ``r`` of ``R`` makes instances ``j = r·B … (r+1)·B - 1``, so batch ``k`` is a pure
  function of ``(seed, k)`` and a 2-rank run with batch ``b`` sees exactly the batches of a
  1-rank run with batch ``2b`` (as data/samplers.py's TrainSampler does for text). The
  sampler's state is the counter ``k``.
- validation: instance ``i`` from ``(VALID, i)``, the same for every seed of a task, so
  validation losses of seeds compare.
- evaluation (eval/tasks/exact_match.py): instance ``i`` from ``(TEST, seed, task, length, depth, i)``.
- competence at L (training/competence.py): instance ``i`` of a task at exactly length ``L``
  from ``(AT_L, task, L, i)``, with a uniform depth, or, for a task that places a needle and
  given the evaluation's depths, at depth ``i mod`` their count; the same for every seed.

A training instance's task is drawn uniformly from the run's tasks, its length uniformly
from that task's shortest up to ``train.seq_len``, and its depth uniformly in [0, 1] (used
by the tasks that place a needle: passkey, multikey). Each row of a batch holds one
instance from position 0, as at evaluation, padded after its end; its targets are the
next tokens where those are answers and ``IGNORE_INDEX`` everywhere else, so the loss
counts answer tokens only. Padding never influences the instance (attention is causal).
Packing several instances per row would waste no compute but let instances attend to
each other and start at positions other than 0.
"""

from __future__ import annotations

import zlib
from typing import Optional, Sequence

import numpy as np
import torch

from ropelab.data.tasks.base import Instance, Task
from ropelab.model.loss import IGNORE_INDEX

TRAIN, VALID, TEST, AT_L = 0, 1, 2, 3  # first word of every seed: the streams never meet


def task_id(name: str) -> int:
    """A stable integer for a task name (Python's hash() changes between processes)."""
    return zlib.crc32(name.encode())


def depth_id(depth: Optional[float]) -> int:
    return 0 if depth is None else 1 + round(depth * 1_000_000)


def draw(tasks: Sequence[Task], seed: Sequence[int], max_length: int) -> Instance:
    """A training-distribution instance: a uniform task, length uniform in [its shortest,
    max_length], a random depth."""
    rng = np.random.default_rng(list(seed))
    task = tasks[int(rng.integers(len(tasks)))]
    length = int(rng.integers(task.min_length(), max_length + 1))
    return task.make(rng, length, float(rng.random()))


def check_fits(tasks: Sequence[Task], seq_len: int) -> None:
    for task in tasks:
        task.check_length(seq_len, "train.seq_len")


def eval_instance(task: Task, seed: int, length: int, depth: Optional[float], index: int) -> Instance:
    """Evaluation instance ``index`` at ``length`` (and passkey ``depth``)."""
    rng = np.random.default_rng([TEST, seed, task_id(task.name), length, depth_id(depth), index])
    return task.make(rng, length, depth)


def length_set(task: Task, length: int, n: int, depths: Optional[Sequence[float]] = None) -> list[Instance]:
    """The fixed instances of ``task`` at ``length`` that a competence stop scores: a random
    depth each, or, for a task that ``has_depth`` and given ``depths`` (the evaluation's
    ``eval.tasks.depths``), those depths in turn, so the stop weighs every depth as the
    report's accuracy at L does. A uniform depth seldom puts the needle at an end of the
    filler (depth 0 or 1), where a model can fail while scoring high everywhere else: a
    learned-position passkey model stopped at 0.98 on uniform depths scored 0.35 with the key
    right before the question and at least 0.97 at every other depth."""
    out = []
    for i in range(n):
        rng = np.random.default_rng([AT_L, task_id(task.name), length, i])
        depth = float(rng.random())  # drawn either way: the rest of instance i is the same
        if depths and task.has_depth:
            depth = float(depths[i % len(depths)])
        out.append(task.make(rng, length, depth))
    return out


def collate(instances: Sequence[Instance], seq_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y), int64 (B, seq_len): inputs padded with ``pad_id``, answer targets, the rest ignored."""
    x = np.full((len(instances), seq_len), pad_id, dtype=np.int64)
    y = np.full((len(instances), seq_len), IGNORE_INDEX, dtype=np.int64)
    for row, inst in enumerate(instances):
        n = inst.length
        x[row, :n] = inst.tokens[:-1]
        y[row, :n] = np.where(inst.answer[1:], inst.tokens[1:], IGNORE_INDEX)
    return torch.from_numpy(x), torch.from_numpy(y)


class TaskSampler:
    """Training batches of task instances; the same interface and state as TrainSampler."""

    def __init__(self, tasks: Sequence[Task], seq_len: int, batch_size: int, seed: int, pad_id: int,
                 rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        check_fits(tasks, seq_len)
        self.tasks, self.seq_len, self.batch_size, self.pad_id = list(tasks), seq_len, batch_size, pad_id
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.batches_drawn = 0

    def instances(self, k: int) -> list[Instance]:
        """This rank's instances of global batch ``k``."""
        first = self.rank * self.batch_size
        return [draw(self.tasks, (TRAIN, self.seed, k, j), self.seq_len)
                for j in range(first, first + self.batch_size)]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = collate(self.instances(self.batches_drawn), self.seq_len, self.pad_id)
        self.batches_drawn += 1
        return batch

    def state_dict(self) -> dict:
        return {"seed": self.seed, "batches_drawn": self.batches_drawn}

    def load_state_dict(self, state: dict) -> None:
        self.seed = int(state["seed"])
        self.batches_drawn = int(state["batches_drawn"])


def validation_batches(tasks: Sequence[Task], seq_len: int, batch_size: int, n_batches: int,
                       pad_id: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed validation set: ``n_batches`` batches of training-distribution instances."""
    check_fits(tasks, seq_len)
    return [collate([draw(tasks, (VALID, b * batch_size + i), seq_len) for i in range(batch_size)],
                    seq_len, pad_id) for b in range(n_batches)]
