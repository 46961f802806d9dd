"""What a grid runs for each of its runs, whichever launcher starts it (scripts/ablate.py on
this machine, scripts/slurm_launcher.py on a cluster): the command that trains or resumes
it, the commands that fill its evaluation caches, and whether those caches are filled.

What is evaluated follows what the run was trained on: perplexity (eval/extrapolation.py)
for a run trained on text, task accuracy (eval/tasks.py) for a synthetic run or one whose
eval asks for tasks. Every command appends its output to the run's ``train.log``
(scripts/job_files.py).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional

import yaml

from configs.grid import Grid, PlannedRun
from eval import extrapolation, tasks
from eval.driver import cached_result
from training.run_dir import RunDir


def train_command(grid: Grid, run: PlannedRun, device: Optional[str] = None) -> list[str]:
    """Train ``run``, or continue it from its newest checkpoint (a finished run exits at once)."""
    cmd = [sys.executable, "-m", "train", str(grid.base), *run.overrides, "train.resume=auto", "log.progress=false"]
    if device == "cpu":
        cmd.append("train.device=cpu")
    return cmd


def eval_modules(run: PlannedRun) -> list[str]:
    return (([] if tasks.is_synthetic(run.cfg) else ["eval.extrapolation"])
            + (["eval.tasks"] if tasks.wants_tasks(run.cfg, run.cfg.eval) else []))


def planned_eval_file(run: PlannedRun) -> dict[str, str]:
    """{path: YAML text}: the eval config the grid plans for ``run``, as a file the
    commands of ``eval_commands`` read (``--eval-file``; scripts/job_files.py writes it)."""
    return {str(RunDir.of(run.cfg).planned_eval): yaml.safe_dump(dataclasses.asdict(run.cfg.eval), sort_keys=False)}


def eval_commands(run: PlannedRun, device: str) -> list[list[str]]:
    """Evaluate finished ``run`` with its planned eval config (``planned_eval_file``, written
    first) into its caches; the grid's reports then read them."""
    run_dir = RunDir.of(run.cfg)
    return [[sys.executable, "-m", module, str(run_dir), "--eval-file", str(run_dir.planned_eval),
             "--cache-only", "--device", device] for module in eval_modules(run)]


def evaluation_cached(run: PlannedRun) -> bool:
    """Whether every evaluation the grid plans for ``run`` is cached for its newest checkpoint."""
    run_dir = RunDir.of(run.cfg)
    evaluations = {"eval.extrapolation": extrapolation.EXTRAPOLATION, "eval.tasks": tasks.TASKS}
    return all(cached_result(evaluations[module], run_dir, run.cfg, run.cfg.eval) is not None
               for module in eval_modules(run))

