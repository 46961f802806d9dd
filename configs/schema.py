"""The typed run configuration: one tree of dataclasses, each validating itself.

``RunConfig{name, out_dir, model, data, train, eval, log}``. ``model`` is
``model.config.ModelConfig`` (architecture only); ``data`` and ``eval`` live in
configs/data_config.py and configs/eval_config.py. YAML turns into these objects through
``configs/loader.py``, which checks keys and types and names the file on error; the checks
here are about values (ranges, combinations) and run in ``__post_init__`` so that an
impossible config fails before any work starts.

Vocabulary size: the tokenizer owns it. Presets do not set ``model.vocab_size``; the
trainer prepares the data, then calls ``cfg.with_vocab_size(tokenizer.vocab_size)``
before building the model and saves *that* config into the run directory, so the saved
config rebuilds the model exactly. To change the vocabulary, set
``data.tokenizer.vocab_size`` (bpe) or ``data.tokenizer.kind``.

Relative data paths (``data.local.*``, ``data.cache_dir``) resolve against the current
working directory, like any command-line path; presets are written to be run from the
repository root.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from ropelab.common.devices import check_device_name
from ropelab.common.errors import ConfigError, positive
# The sections kept in their own modules, gathered here: ``from configs.schema import X`` is
# how the rest of the project names any of them.
from ropelab.configs.data_config import (HUB_PRESETS, DataConfig, DocumentMode, HubConfig, LocalConfig,
                                 TokenizerConfig)
from ropelab.configs.diagnostics import DiagnosticsConfig
from ropelab.configs.eval_config import EvalConfig, EvalCorpus, Protocol
from ropelab.configs.tasks import MixConfig, SyntheticConfig, TaskEvalConfig
from ropelab.model.config import ModelConfig
from ropelab.model.encodings import KINDS, kinds_where, served_length

__all__ = ["HUB_PRESETS", "DataConfig", "DiagnosticsConfig", "DocumentMode", "EvalConfig", "EvalCorpus", "HubConfig",
           "InitConfig", "LocalConfig", "LogConfig", "MixConfig", "Protocol", "RandomPositionsConfig", "RunConfig",
           "SyntheticConfig", "TaskEvalConfig", "TokenizerConfig", "TrainConfig"]


@dataclass
class RandomPositionsConfig:
    """Randomized positions (Ruoss et al. 2023, ACL): each training sequence of seq_len
    tokens gets a sorted random subset of [0, max_len) as its positions instead of
    0 … seq_len−1, so the positions of longer evaluation windows were all seen in
    training. Evaluation and generation use 0 … T−1. Draws are a pure function of
    (train.seed, batch index), like the training windows (data/samplers.py)."""

    max_len: int = 1024

    def __post_init__(self) -> None:
        positive("train.random_positions", self, "max_len")


@dataclass


@dataclass
class TrainConfig:
    """The optimisation run. Exactly one of max_steps / max_tokens sets its length."""

    seq_len: int = 128
    batch_size: int = 16  # micro-batch per rank
    grad_accum: int = 1
    # Exactly one is set; to budget by tokens write max_steps: null, max_tokens: N.
    max_steps: Optional[int] = 1000
    max_tokens: Optional[int] = None  # total tokens over all ranks and micro-batches
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decay floor, as a fraction of lr
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    seed: int = 1337  # the initialisation, and the data order unless data_seed is set
    # The order of the training batches (and randomized positions): null uses train.seed, as
    # every run did before the key existed; set it to vary initialisation and data apart.
    data_seed: Optional[int] = None
    device: str = "auto"  # auto, cpu, cuda, cuda:N or mps (common/devices.py)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # torch.compile the model: true, false, or auto (training/step_timing.py decides from timed steps
    # of this shape whether the compile time pays back over the run's remaining steps).
    compile: Union[bool, Literal["auto"]] = False
    eval_interval: int = 200
    eval_batches: int = 20
    ckpt_interval: int = 200
    keep_last: int = 2
    resume: Literal["never", "auto"] = "never"
    log_interval: int = 10
    # null: positions 0 … seq_len−1; {max_len: N}: randomized positions from [0, N)
    random_positions: Optional[RandomPositionsConfig] = None
    # The positional encoding's own parameters train at lr × this (training/optim.py); only
    # for encodings that have some (``trained`` in model/encodings.py).
    pos_lr_multiplier: float = 1.0
    # Synthetic runs (and text runs with data.mix, on their mixed tasks): stop once the
    # exact-match accuracy at seq_len on a fixed set of eval_batches x batch_size instances per
    # task (checked every eval_interval steps) reaches this for every task; max_steps is then
    # the budget (training/competence.py). null: no stop.
    stop_at_accuracy: Optional[float] = None
    # With stop_at_accuracy: how many checks in a row must pass before the run stops (1: the
    # first that passes; 2 keeps a lucky check on a few hundred instances from ending a run).
    stop_checks: int = 1

    def __post_init__(self) -> None:
        positive("train", self, "seq_len", "batch_size", "grad_accum", "eval_interval",
                  "eval_batches", "ckpt_interval", "keep_last", "log_interval", "stop_checks")
        positive("train", self, "max_steps", "max_tokens", allow_none=True)
        check_device_name(self.device, "train.device")
        if self.seed < 0:  # numpy's generators (samplers, tasks) take non-negative seeds only
            raise ConfigError(f"train.seed must be 0 or more (got {self.seed})")
        if self.data_seed is not None and self.data_seed < 0:
            raise ConfigError(f"train.data_seed must be 0 or more, or null to follow train.seed (got {self.data_seed})")
        if (self.max_steps is None) == (self.max_tokens is None):
            raise ConfigError("set exactly one of train.max_steps and train.max_tokens "
                              f"(got max_steps={self.max_steps}, max_tokens={self.max_tokens}); "
                              "set the other to null")
        if not self.lr > 0:
            raise ConfigError(f"train.lr must be positive (got {self.lr})")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"train.min_lr_ratio must be in [0, 1] (got {self.min_lr_ratio})")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError("train.warmup_steps, weight_decay and grad_clip must be >= 0")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"train.{key} must be in [0, 1) (got {getattr(self, key)})")
        if not self.pos_lr_multiplier > 0:
            raise ConfigError(f"train.pos_lr_multiplier must be positive (got "
                              f"{self.pos_lr_multiplier}); 1 trains the positional parameters at train.lr")
        if self.stop_at_accuracy is not None and not 0.0 < self.stop_at_accuracy <= 1.0:
            raise ConfigError(f"train.stop_at_accuracy must be in (0, 1], an exact-match accuracy, or null "
                              f"(got {self.stop_at_accuracy})")
        if self.stop_checks != 1 and self.stop_at_accuracy is None:
            raise ConfigError(f"train.stop_checks={self.stop_checks} counts the checks of the competence stop, "
                              "and train.stop_at_accuracy is null (no stop): set train.stop_at_accuracy, or "
                              "train.stop_checks=1")

    @property
    def data_order_seed(self) -> int:
        """The seed of the batches' order: ``data_seed``, or ``seed`` when it is unset."""
        return self.seed if self.data_seed is None else self.data_seed

    def tokens_per_step(self, world_size: int = 1) -> int:
        return self.batch_size * self.grad_accum * self.seq_len * world_size

    def total_steps(self, world_size: int = 1) -> int:
        """Optimizer steps in the run (max_tokens rounds up to whole steps)."""
        if self.max_steps is not None:
            return self.max_steps
        return math.ceil(self.max_tokens / self.tokens_per_step(world_size))


@dataclass
class InitConfig:
    """Start from a trained run (fine-tuning, context extension).

    Weights only: the new run has its own optimizer, schedule, ``train.seq_len`` and RoPE
    scaling (``model.pos.rope.scaling``, active in training and then part of the new
    run's model). The architecture must be the parent's, apart from the scaling. The new
    run records its parent in its checkpoints and saves the starting weights as step 0.
    """

    run: Optional[str] = None  # the parent run directory
    which: Literal["latest", "best"] = "latest"
    # The checkpoint of this training step instead of ``which``; the parent need not have
    # finished (e.g. carrying on from a diverged run's last good step: training/nonfinite.py).
    step: Optional[int] = None

    def __post_init__(self) -> None:
        if self.step is not None and self.step < 0:
            raise ConfigError(f"init.step is a training step of the parent, 0 or more (got {self.step})")
        if self.step is not None and self.which == "best":
            raise ConfigError(f"init.step={self.step} and init.which=best both choose the parent's checkpoint; "
                              "give one of them")
        if self.run is None and (self.step is not None or self.which != "latest"):
            raise ConfigError("init.step and init.which choose a checkpoint of init.run; set init.run (the parent "
                              "run directory) too, or remove them")


@dataclass
class LogConfig:
    """Where metrics go besides metrics.jsonl in the run directory."""

    wandb: bool = False
    wandb_project: str = "ropelab"
    wandb_entity: Optional[str] = None
    # None: wandb's own choice, which reads WANDB_MODE (online where it is unset); a value here overrides it.
    wandb_mode: Optional[Literal["online", "offline"]] = None
    # A tqdm bar on a terminal; with false, or when output goes to a file, one line per
    # train.log_interval steps and per validation instead.
    progress: bool = True


@dataclass
class RunConfig:
    """Everything a run needs; written into the run directory as config.yaml."""

    name: str = "run"
    out_dir: str = "runs"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    init: InitConfig = field(default_factory=InitConfig)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or "\\" in self.name:
            raise ConfigError(f"name must be a non-empty run name without slashes (got {self.name!r})")
        pos = self.model.pos
        self._check_served("train.seq_len", self.train.seq_len, "is shorter than")
        for name, layer in self.model.layers.types.items():
            if layer.window is not None and layer.window > self.train.seq_len:
                raise ConfigError(f"model.layers.types.{name}.window={layer.window} is larger than the training "
                                  f"context train.seq_len={self.train.seq_len}: the layer would attend to every key in "
                                  "training and the window would first act past it; use a window of at most "
                                  f"{self.train.seq_len}, or null for full attention")
        if self.train.random_positions is not None:
            self._check_random_positions(self.train.random_positions.max_len)
        mix = self.data.mix
        if mix.tasks and not 1 <= round(mix.fraction * self.train.batch_size) < self.train.batch_size:
            raise ConfigError(f"data.mix.fraction={mix.fraction} of train.batch_size={self.train.batch_size} rows is "
                              f"{round(mix.fraction * self.train.batch_size)} task rows per batch; it must leave at "
                              "least one task row and one text row: change the fraction or the batch size")
        if self.train.stop_at_accuracy is not None and self.data.source != "synthetic" and not mix.tasks:
            raise ConfigError(f"train.stop_at_accuracy={self.train.stop_at_accuracy} needs tasks to score: a "
                              "synthetic run (data.source=synthetic) or a text run that mixes tasks in (data.mix); "
                              "it stops on the tasks' exact-match accuracy at train.seq_len. Remove it for a run "
                              "trained on text alone")
        if mix.tasks:  # the mixed tasks are built from data.synthetic's settings: refuse what they cannot make
            self.data.synthetic.for_tasks(mix.tasks)
        if self.train.stop_at_accuracy is not None:  # the stop scores what the evaluation asks: refuse now
            stopped_on = self.data.synthetic.tasks if self.data.source == "synthetic" else mix.tasks
            self.data.synthetic.scored_as(self.eval.tasks.asked, stopped_on)
        elif self.eval.tasks.asked is not None and (self.data.source == "synthetic" or mix.tasks):
            # The evaluation after training asks it of the tasks it trained on: refused now, not after training.
            learned = self.data.synthetic.tasks if self.data.source == "synthetic" else mix.tasks
            self.data.synthetic.scored_as(self.eval.tasks.asked, [t for t in self.eval.tasks.tasks or learned
                                                                   if t in learned])
        if self.train.pos_lr_multiplier != 1.0 and not KINDS[pos.kind].trained:
            raise ConfigError(f"train.pos_lr_multiplier={self.train.pos_lr_multiplier} has nothing to act on: "
                              f"model.pos.kind={pos.kind} has no learned parameters (those that do: "
                              f"{', '.join(sorted(kinds_where('trained')))}); remove it or set it to 1")

    def _check_served(self, key: str, positions: int, relation: str) -> None:
        """Refuse training positions 0 … ``positions``−1 that the encoding cannot serve."""
        pos, limit = self.model.pos, served_length(self.model.pos)
        if limit is not None and limit < positions:
            row = KINDS[pos.kind]
            raise ConfigError(f"model.pos.{row.limit.key}={limit} {relation} {key}={positions}: {key} exceeds "
                              f"the {limit} positions pos.kind={pos.kind} serves ({row.limit.why}); "
                              f"{row.limit.fix}, or lower {key}")

    def _check_random_positions(self, max_len: int) -> None:
        pos, seq_len = self.model.pos, self.train.seq_len
        if max_len < seq_len:
            raise ConfigError(f"train.random_positions.max_len={max_len} is smaller than train.seq_len="
                              f"{seq_len}: each sequence needs {seq_len} distinct positions from "
                              f"[0, max_len); use a max_len of at least {seq_len} (typically the longest "
                              "evaluation length)")
        if not KINDS[pos.kind].takes_positions:
            raise ConfigError(f"train.random_positions has no effect with model.pos.kind={pos.kind} "
                              f"({KINDS[pos.kind].no_positions}: it takes no position indices); remove it or "
                              f"choose an encoding that takes positions ({', '.join(kinds_where('takes_positions'))})")
        self._check_served("train.random_positions.max_len", max_len, "is smaller than")

    def with_vocab_size(self, vocab_size: int) -> RunConfig:
        """This config with model.vocab_size set from the tokenizer (see module docstring)."""
        return dataclasses.replace(self, model=dataclasses.replace(self.model, vocab_size=vocab_size))
