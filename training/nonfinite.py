"""A run whose numbers stopped being numbers: the errors, and the way on that works as written.

Training stops at the first non-finite loss or gradient norm, before the update, so no
checkpoint with NaN weights is ever written by it; a checkpoint that holds some anyway
(altered since, or written by an older version) is refused wherever it is loaded
(training/checkpoint.py: ``NonFiniteWeights``). Either way the advice is the same command.

Why a new run and not ``--resume`` with a lower ``train.lr``: a resumed run is the same
experiment (configs/experiment.py), and one whose learning rate changed half-way is not
the experiment its config describes. The way on is a new run that starts from the newest
checkpoint with finite weights (``init.run`` + ``init.step``): a fresh optimizer and
learning-rate schedule (warmup included) over the steps the diverged run had left, at half
its learning rate, recorded as that run's child in every checkpoint (``parent``), so
reports say where it started. Its name says so too: ``NAME-from{STEP}-lr{LR}``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import torch

from ropelab.common.errors import CheckpointError, UserError
from ropelab.configs.schema import RunConfig
from ropelab.training.checkpoint import NonFiniteWeights, UnreadableCheckpoint, non_finite, read_meta, read_weights
from ropelab.training.run_dir import RunDir


class TrainingError(UserError):
    """The run cannot continue (e.g. a non-finite loss); checkpoints already saved are kept."""


def newest_finite_checkpoint(run: RunDir, before: Optional[Path] = None) -> Optional[tuple[Path, dict]]:
    """(checkpoint, meta) of the newest complete checkpoint whose weights read and are all
    finite (older than ``before`` when given), or None."""
    for ckpt in run.complete_checkpoints()[::-1]:
        if before is not None and ckpt.name >= before.name:
            continue
        try:
            meta = read_meta(ckpt)
            if not non_finite(read_weights(ckpt)):
                return ckpt, meta
        except UnreadableCheckpoint:
            continue
    return None


def _free_name(run: RunDir, name: str) -> str:
    """``name``, or ``name-2``, ``name-3`` … : the first that no directory beside ``run`` has."""
    candidate, n = name, 1
    while (run.path.parent / candidate).exists():
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def train_command(config: Path, out_dir: Path, name: str, *overrides: str) -> str:
    """``python train.py CONFIG out_dir=… name=… OVERRIDES``: where the run goes is always
    given, so a run directory that was copied or moved is no obstacle."""
    return shlex.join(["python", "train.py", str(config), f"out_dir={out_dir}", f"name={name}", *overrides])


def retrain_advice(run: RunDir, *overrides: str) -> str:
    """Move ``run`` aside and train it again from step 0 from its own config (as a sentence's end)."""
    aside = run.path.with_name(run.path.name + ".damaged")
    return (f"mv {shlex.quote(str(run.path))} {shlex.quote(str(aside))} && "
            + train_command(aside / run.config.name, run.path.parent, run.path.name, *overrides))


def restart_advice(run: RunDir, cfg: RunConfig, before: Optional[Path] = None) -> str:
    """The command that carries on after a divergence, as a sentence (see the module docstring)."""
    t = cfg.train
    lr = t.lr / 2
    extra = ["train.grad_clip=1"] if t.grad_clip == 0 else []  # clipping off: turn it on too
    found = newest_finite_checkpoint(run, before)
    if found is None:
        if before is None and not run.complete_checkpoints():
            command = train_command(run.config, run.path.parent, run.path.name, f"train.lr={lr:g}", *extra)
            return ("It has no checkpoint yet: train it again from step 0 at half the learning rate (lower it "
                    f"further if the loss diverges again): {command}")
        return ("None of its checkpoints has finite weights: move the run aside and train it again from step 0 "
                f"at half the learning rate: {retrain_advice(run, f'train.lr={lr:g}', *extra)}")
    ckpt, meta = found
    step = int(meta["step"])
    budget = (f"train.max_steps={max(1, t.total_steps() - step)}" if t.max_steps is not None
              else f"train.max_tokens={max(1, t.max_tokens - int(meta.get('tokens') or 0))}")
    name = _free_name(run, f"{run.path.name}-from{step}-lr{lr:g}")
    command = train_command(run.config, run.path.parent, name, f"init.run={run.path}", f"init.step={step}",
                            f"train.lr={lr:g}", budget, *extra)
    return (f"Carry on from step {step} ({ckpt.name}, its newest checkpoint with finite weights) in a new run at half "
            "the learning rate, with a fresh optimizer and schedule over the steps that were left; the new run "
            "records where it started (a resumed run would be the same experiment and meet the same loss): "
            + command)


def diverged(what: str, step: int, run: RunDir, cfg: RunConfig, seen: Optional[int] = None) -> TrainingError:
    """The error for a non-finite ``what`` ("the loss became nan") at training step ``step``,
    found at step ``seen`` (a logging step; None: at once, before the update)."""
    when = ("the run stopped before the update" if seen is None else
            "the run stopped there and saved nothing after it" if seen == step else
            f"the run found it at step {seen}, its next logging step, and saved nothing after it")
    return TrainingError(f"{what} at step {step}; {when}, and nothing it saved was changed. "
                         f"{restart_advice(run, cfg)}")


class NonFiniteWatch:
    """The first training step whose loss (or gradient norm) was not finite, kept on the device.

    Reading a loss back every step makes the host wait for the device; the watch records the
    step on the device instead, and the trainer reads it with the logged values at each
    logging step and before every save, so a divergence is caught within one logging interval
    and no checkpoint with weights it touched is ever written.
    """

    def __init__(self, device: torch.device):
        self.first = torch.full((), -1.0, device=device)  # float: read back with the logged values

    def update(self, step: int, loss: torch.Tensor, grad_norm: Optional[torch.Tensor]) -> None:
        finite = torch.isfinite(loss) if grad_norm is None else torch.isfinite(loss) & torch.isfinite(grad_norm)
        self.first = torch.where(~finite & (self.first < 0), torch.full_like(self.first, step), self.first)


def non_finite_checkpoint(error: NonFiniteWeights, run: RunDir, cfg: RunConfig) -> CheckpointError:
    """``error`` (a checkpoint of ``run`` with NaN weights) with the way on."""
    ckpt = error.path.parent
    before = ckpt if ckpt.parent == run.checkpoints else None  # best/ is no step: any step may stand in
    return CheckpointError(f"{error}: the training that wrote it diverged, or the file was altered since, so nothing "
                           "computed from it would mean anything (it is not evaluated, sampled, exported or trained "
                           f"on). {restart_advice(run, cfg, before)}")
