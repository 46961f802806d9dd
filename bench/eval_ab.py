"""The engine of ``ropelab bench-eval`` (scripts/bench_eval.py, whose docstring says what is
measured): each side's evaluation of fresh copies of the runs in its own process, against
its tree's code (bench/trees.py), and the numbers both sides scored, compared cell by cell.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import yaml

from ropelab.bench.trees import ROOT, Tree
from ropelab.common.errors import ArgumentError, UserError
from ropelab.common.logs import get_logger
from ropelab.configs.loader import load_config_tree

logger = get_logger(__name__)

SIDES = ("base", "this")
# Runs the main() of MODULE (the perplexity sweep's command) from the tree given first on the
# command line, whatever the current directory holds (the runs' relative data paths are
# resolved from this repository's root, the current directory).
LAUNCH = ("import importlib, sys; tree, module = sys.argv.pop(1), sys.argv.pop(1); sys.path.insert(0, tree); "
          "sys.argv[0] = module; sys.exit(importlib.import_module(module).main())")


def eval_module(tree: Tree) -> str:
    """The perplexity sweep's command in ``tree``: ``eval.extrapolation`` before the package."""
    return "ropelab.eval.lm.extrapolation" if tree.is_package else "eval.extrapolation"


def cell_key(row: dict) -> tuple:
    return row["name"], row["corpus"], row["scaling"], row["length"], row["protocol"]


def cells_of(results: dict) -> dict[tuple, dict]:
    """The scored cells of a results.json, by (run, corpus, scaling, length, protocol)."""
    return {cell_key(r): r for r in results["results"] if r.get("status", "ok") == "ok" and "ppl" in r}


def compare_cells(base: dict, this: dict) -> dict:
    """The largest relative difference of perplexity and of mean NLL over the cells both
    sides scored, the cell where each occurs, and the cells only one side has."""
    a, b = cells_of(base), cells_of(this)
    shared = sorted(set(a) & set(b), key=str)
    worst: dict[str, tuple[float, Optional[tuple]]] = {"ppl": (0.0, None), "nll": (0.0, None)}
    for key in shared:
        for field in worst:
            x, y = a[key][field], b[key][field]
            rel = abs(y - x) / abs(x) if x else abs(y - x)
            if rel > worst[field][0]:
                worst[field] = (rel, key)
    return {"cells": len(shared), "only_base": [list(k) for k in sorted(set(a) - set(b), key=str)],
            "only_this": [list(k) for k in sorted(set(b) - set(a), key=str)],
            **{f"max_rel_{f}": v for f, (v, _) in worst.items()},
            **{f"max_rel_{f}_cell": list(k) if k else None for f, (_, k) in worst.items()}}


def copy_runs(runs: list[Path], into: Path) -> list[Path]:
    """Copies of the runs without their cached evaluations."""
    into.mkdir(parents=True)
    copies = []
    for run in runs:
        copy = into / run.name
        shutil.copytree(run, copy, ignore=lambda d, names: ["eval"] if Path(d) == run else [])
        copies.append(copy)
    return copies


def evaluate(side: str, tree: Tree, runs: list[Path], eval_file: Path, scratch: Path, threads: int) -> dict:
    """One side's evaluation of fresh copies of ``runs``: its wall time and results.json."""
    work = Path(tempfile.mkdtemp(prefix=f"{side}-", dir=scratch))
    copies = copy_runs(runs, work / "runs")
    out = work / "report"
    cmd = [sys.executable, "-c", LAUNCH, str(tree.root), eval_module(tree), *map(str, copies),
           "--eval-file", str(eval_file), "--out", str(out)]
    env = tree.env({**os.environ, "OMP_NUM_THREADS": str(threads)})
    logger.info(f"{side}: evaluating {len(runs)} run(s) …")
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:]) or "no output"
        hint = ""
        if side == "base" and "unknown key" in proc.stderr:
            # The older code reads the runs' config.yaml, which may carry keys added after it.
            hint = ("\nthe runs' config.yaml has a key the code at --compare predates: compare against a "
                    "revision at least as new as the one that trained the runs (`commits` in their "
                    "checkpoints' meta.json)")
        raise UserError(f"the {side} side's evaluation failed (exit {proc.returncode}):\n{tail}{hint}")
    results = json.loads((out / "results.json").read_text())
    shutil.rmtree(work, ignore_errors=True)
    return {"seconds": seconds, "results": results}


def grid_eval(grid: Path, sets: list[str]) -> dict:
    """The grid's eval block (its own and what it inherits) with ``--set`` applied (values read as YAML)."""
    if not grid.is_file():
        raise ArgumentError(f"--grid {grid}: no such file; give a grid of configs/ablations/")
    block = dict(load_config_tree(grid)[0].get("eval") or {})  # with what the grid inherits
    if not block:
        raise UserError(f"--grid {grid}: it has no eval: block to measure")
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ArgumentError(f"--set {item!r}: expected KEY=VALUE (an eval key, e.g. max_tokens=20000)")
        block[key] = yaml.safe_load(value)
    return block


def summarize(rounds: list[dict[str, dict]]) -> dict:
    base = [r["base"]["seconds"] for r in rounds]
    this = [r["this"]["seconds"] for r in rounds]
    ratios = [b / t for b, t in zip(base, this)]
    return {"base_s": statistics.median(base), "this_s": statistics.median(this),
            "speedup": statistics.median(ratios), "speedups": ratios}
