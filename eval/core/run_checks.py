"""Checks of the runs an evaluation is asked for, before any work (eval/core/evaluation.py runs them):
no run given twice or as a copy (pooled, a copy would count as another seed of its row), and
a RoPE scaling asked for on the command line that some run has."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from ropelab.common.errors import ArgumentError, UserError
from ropelab.common.logs import get_logger
from ropelab.configs.experiment import seed_group
from ropelab.model.encodings import accepts_rope_scaling, kinds_where
from ropelab.training.checkpoint import read_meta
from ropelab.training.run_dir import RunDir
from ropelab.training.saved_run import read_run_config

logger = get_logger(__name__)


def _latest_tokens(run: RunDir) -> Optional[int]:
    try:
        ckpt = run.latest_checkpoint()
        return None if ckpt is None else read_meta(ckpt).get("tokens")
    except UserError:
        return None


def check_distinct(run_dirs: Sequence[Path]) -> None:
    """Refuse a run given twice, or two runs that are the same training (the same experiment,
    seed and tokens: a copy): pooled, either would count as two seeds of one row."""
    seen: dict[Path, Path] = {}
    trainings: dict[tuple, Path] = {}
    for run_dir in map(Path, run_dirs):
        key = run_dir.resolve()
        if key in seen:
            raise ArgumentError(f"{run_dir} is given twice (as {str(seen[key])!r} and {str(run_dir)!r}, the same "
                                "directory); each run counts once, so give it once")
        seen[key] = run_dir
        try:
            cfg = read_run_config(RunDir(run_dir))
        except UserError:
            continue  # reported as missing by the evaluation itself
        training = (seed_group(cfg), cfg.train.seed, _latest_tokens(RunDir(run_dir)))
        if training in trainings:
            raise ArgumentError(f"{trainings[training]} and {run_dir} are the same training (the same experiment, "
                                f"train.seed={cfg.train.seed} and tokens trained): one is a copy of the other, and "
                                "pooled they would count as two seeds of one row; give one of them")
        trainings[training] = run_dir


def check_flags(args: argparse.Namespace, run_dirs: Sequence[Path]) -> None:
    """A RoPE scaling asked for on the command line must apply to some run (it is ignored for
    the others, which are evaluated as they are, with a note); --factor needs one."""
    if args.factor is not None and args.scalings is not None and set(args.scalings) == {"none"}:
        raise ArgumentError("--factor sets the factor of a RoPE scaling, but --scaling asks for none; add one "
                            "(e.g. --scaling none yarn) or drop --factor")
    asked = [s for s in args.scalings or () if s != "none"]
    if not asked:
        return
    kinds = {}
    for run_dir in run_dirs:
        try:
            kinds[str(run_dir)] = read_run_config(RunDir(run_dir)).model.pos.kind
        except UserError:
            continue
    without = [run for run, kind in kinds.items() if not accepts_rope_scaling(kind)]
    if kinds and len(without) == len(kinds):
        raise ArgumentError(f"--scaling {' '.join(asked)} scales RoPE's frequencies, but no run given has any "
                            f"({', '.join(sorted(set(kinds.values())))}; scalings apply to pos.kind="
                            f"{' or '.join(kinds_where('rope_scaling'))}); drop --scaling")
    for run in without:
        logger.warning(f"note: {run} (pos.kind={kinds[run]}) takes no RoPE scaling: it is evaluated without "
                       f"--scaling {' '.join(asked)}")
