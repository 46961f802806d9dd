"""What a grid runs for each of its runs, whichever launcher starts it (ropelab ablate on
this machine, grid/slurm_launcher.py on a cluster): the command that trains or resumes
it, the commands that fill its evaluation caches, and whether those caches are filled.

What is evaluated follows what the run was trained on: perplexity (eval/lm/extrapolation.py)
for a run trained on text, task accuracy (eval/exact_match.py) for a synthetic run or one whose
eval asks for tasks, and the attention diagnostics (ropelab diagnose) when its
``eval.diagnostics.enabled`` is set. Every command appends its output to the run's
``train.log`` (grid/job_files.py).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Optional

import yaml

from ropelab.configs.grid import Grid, PlannedRun
from ropelab.eval.diagnostics import measure
from ropelab.eval.lm import extrapolation
from ropelab.eval.tasks import exact_match
from ropelab.eval.core.evaluation import Evaluation, cached_result
from ropelab.training.run_dir import RunDir


def train_command(grid: Grid, run: PlannedRun, device: Optional[str] = None) -> list[str]:
    """Train ``run``, or continue it from its newest checkpoint (a finished run exits at once)."""
    cmd = [sys.executable, "-m", "ropelab.train", str(grid.base), *run.overrides, "train.resume=auto", "log.progress=false"]
    if device == "cpu":
        cmd.append("train.device=cpu")
    return cmd


def planned_evaluations(run: PlannedRun) -> dict[str, Evaluation]:
    """{module run with ``python -m``: its evaluation} for every evaluation the grid plans for ``run``."""
    planned = {}
    if not exact_match.is_synthetic(run.cfg):
        planned["ropelab.eval.lm.extrapolation"] = extrapolation.EXTRAPOLATION
    if exact_match.wants_tasks(run.cfg, run.cfg.eval):
        planned["ropelab.eval.tasks.exact_match"] = exact_match.TASKS
    if run.cfg.eval.diagnostics.enabled:
        planned["ropelab.scripts.diagnose"] = measure.DIAGNOSTICS
    return planned


def planned_caches(run: PlannedRun) -> list[Path]:
    """The cache file of every evaluation the grid plans for ``run`` (RunDir.eval_cache)."""
    run_dir = RunDir.of(run.cfg)
    return [run_dir.eval_cache(e.name, e.cache_key(run.cfg, run.cfg.eval)) for e in planned_evaluations(run).values()]


def planned_eval_file(run: PlannedRun) -> dict[str, str]:
    """{path: YAML text}: the eval config the grid plans for ``run``, as a file the
    commands of ``eval_commands`` read (``--eval-file``; grid/job_files.py writes it)."""
    return {str(RunDir.of(run.cfg).planned_eval): yaml.safe_dump(dataclasses.asdict(run.cfg.eval), sort_keys=False)}


def eval_commands(run: PlannedRun, device: str) -> list[list[str]]:
    """Evaluate finished ``run`` with its planned eval config (``planned_eval_file``, written
    first) into its caches; the grid's reports then read them."""
    run_dir = RunDir.of(run.cfg)
    return [[sys.executable, "-m", module, str(run_dir), "--eval-file", str(run_dir.planned_eval),
             "--cache-only", "--device", device] for module in planned_evaluations(run)]


def not_cached(run: PlannedRun, record: Optional[Path] = None) -> list[str]:
    """The evaluations the grid plans for ``run`` that are not cached for its newest checkpoint;
    ``record``: those its record in the grid's archive lacks (caches packed there,
    training/run_record.py), before it is restored."""
    if record is not None:
        packed = RunDir(record).eval_dir
        return [e.name for e, cache in zip(planned_evaluations(run).values(), planned_caches(run))
                if not (packed / f"{cache.name}.gz").is_file()]
    run_dir = RunDir.of(run.cfg)
    return [e.name for e in planned_evaluations(run).values()
            if cached_result(e, run_dir, run.cfg, run.cfg.eval) is None]


def evaluation_cached(run: PlannedRun) -> bool:
    """Whether every evaluation the grid plans for ``run`` is cached for its newest checkpoint."""
    return not not_cached(run)

