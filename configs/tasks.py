"""Config sections for synthetic tasks: what a synthetic run trains on, and how tasks are scored.

``data.synthetic`` (SyntheticConfig) picks the tasks a ``data.source: synthetic`` run trains
on and their parameters; ``eval.tasks`` (TaskEvalConfig, nested in the one EvalConfig)
says which tasks ``python -m eval.tasks`` scores, on how many instances, at which passkey
depths, and what counts as retrieval succeeding for k_max. The generators themselves
live in ``data/tasks/``; ``TASK_NAMES`` is the one list of them (tests/test_tasks.py
keeps the registry's keys equal to it).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal, Optional

from common.errors import ConfigError

TaskName = Literal["passkey", "copy", "recall", "addition"]
TASK_NAMES: tuple[str, ...] = typing.get_args(TaskName)


@dataclass
class SyntheticConfig:
    """Tasks made on the fly (data/tasks/): instances are drawn, never stored or downloaded.

    Each training instance comes from one of ``tasks``, drawn uniformly (one task: a
    single-task run; several: one model learns them all), with a length drawn uniformly
    between that task's shortest instance and ``train.seq_len``; it is padded to
    ``train.seq_len`` and only its answer tokens count in the loss.
    """

    tasks: list[TaskName] = field(default_factory=lambda: ["passkey"])
    key_digits: int = 5  # passkey: digits of the key (Chen et al. 2023 use 5 random digits)
    pairs: int = 8  # recall: key-value pairs stated before the queries (at most 26 keys)
    queries: Optional[int] = None  # recall: keys queried per instance (None: every pair once)
    # addition: each sum digit right after its operand digits, or the whole sum after both
    # operands (see data/tasks/addition.py)
    addition_layout: Literal["aligned", "sequential"] = "aligned"

    def __post_init__(self) -> None:
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"data.synthetic.tasks must name one or more distinct tasks of "
                              f"{', '.join(TASK_NAMES)} (got {self.tasks})")
        if not 1 <= self.key_digits <= 18:
            raise ConfigError(f"data.synthetic.key_digits must be in [1, 18] (got {self.key_digits})")
        if not 1 <= self.pairs <= 26:
            raise ConfigError(f"data.synthetic.pairs must be in [1, 26]: keys are the letters a-z "
                              f"(got {self.pairs})")
        if self.queries is not None and not 1 <= self.queries <= self.pairs:
            raise ConfigError(f"data.synthetic.queries must be in [1, pairs={self.pairs}]: each query "
                              f"asks for a distinct stated key (got {self.queries})")

    @property
    def n_queries(self) -> int:
        return self.pairs if self.queries is None else self.queries


@dataclass
class TaskEvalConfig:
    """Exact-match accuracy on synthetic tasks (``python -m eval.tasks``; key ``eval.tasks``).

    Lengths and RoPE scalings are the enclosing EvalConfig's (``eval.lengths`` or
    ``eval.length_multipliers`` x train.seq_len, ``eval.scalings``), shared with the
    perplexity sweep. ``samples`` instances are scored per length, and for passkey per
    (length, depth) cell. Test instances are a pure function of ``seed``, the task, the
    length, the depth and the instance index, so every run is scored on the same ones.
    """

    # Empty: the run's own tasks (synthetic runs) or passkey (runs trained on text).
    tasks: list[TaskName] = field(default_factory=list)
    samples: int = 100
    # Passkey: where the key sits, as the fraction of the filler before it (0: first, 1: last).
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    # k_max (Chen et al. 2023): retrieval "succeeds" in a cell whose accuracy is at least this.
    kmax_threshold: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ConfigError(f"eval.tasks.samples must be a positive integer (got {self.samples})")
        if not self.depths:
            raise ConfigError("eval.tasks.depths must list at least one passkey depth in [0, 1]")
        bad = [d for d in self.depths if not 0.0 <= d <= 1.0]
        if bad:
            raise ConfigError(f"eval.tasks.depths must be in [0, 1] (0: key first, 1: key right before "
                              f"the question); got {bad}")
        if not 0.0 < self.kmax_threshold <= 1.0:
            raise ConfigError(f"eval.tasks.kmax_threshold must be in (0, 1] (got {self.kmax_threshold})")
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"eval.tasks.tasks lists a task twice: {self.tasks}")
        if self.seed < 0:
            raise ConfigError(f"eval.tasks.seed must be 0 or more (got {self.seed})")

    def resolved_depths(self) -> list[float]:
        return sorted(set(self.depths))
