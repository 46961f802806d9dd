"""Evaluation time A/B against an older tree, on the same runs, with the numbers compared:
``ropelab bench-eval --compare REV --grid GRID RUN [RUN ...] [--set KEY=VALUE ...]``.

Each side (``base``: the code at git revision REV; ``this``: this tree) evaluates fresh
copies of the same finished runs with ``ropelab eval RUN ... --eval-file E``,
where E is the grid's ``eval:`` block (``--set`` changes keys of it, e.g. ``max_tokens=20000``
for a shorter measurement). The copies carry no cached evaluation (a run's ``eval/``
directory is left out, and each side's copies sit in a directory of their own, so no
``.eval-cells/`` store is shared), so each side does all of its work, the report included.
With ``--rounds N`` the sides take turns N times, the side that goes first alternating.

Recorded per side and round: the evaluation's wall time (the whole command, from start to
the written report). The summary gives each side's median, their ratio, and for every cell
both sides scored (run, corpus, scaling, length, protocol) the relative difference of its
perplexity and its mean NLL: the numbers a faster evaluation must not change.

Run from the repository root, on a quiet machine: two processes that share the cores make
the times meaningless (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
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

from ropelab.common.cli import check_output_file, entry_point, positive_int, moved
from ropelab.common.errors import ArgumentError, UserError
from ropelab.configs.loader import load_config_tree
from ropelab.scripts.bench import git_commit_of, machine, tree_at

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("base", "this")
# Runs eval.extrapolation from the tree given first on the command line, whatever the current
# directory holds (the runs' relative data paths are resolved from this repository's root).
LAUNCH = ("import runpy, sys; tree = sys.argv.pop(1); sys.path.insert(0, tree); sys.argv[0] = 'eval.extrapolation'; "
          "runpy.run_module('eval.extrapolation', run_name='__main__', alter_sys=True)")


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


def evaluate(side: str, tree: Path, runs: list[Path], eval_file: Path, scratch: Path, threads: int) -> dict:
    """One side's evaluation of fresh copies of ``runs``: its wall time and results.json."""
    work = Path(tempfile.mkdtemp(prefix=f"{side}-", dir=scratch))
    copies = copy_runs(runs, work / "runs")
    out = work / "report"
    cmd = [sys.executable, "-c", LAUNCH, str(tree), *map(str, copies), "--eval-file", str(eval_file),
           "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(tree)}
    print(f"{side}: evaluating {len(runs)} run(s) …", file=sys.stderr, flush=True)
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


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ropelab bench-eval", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished run directories, evaluated by both sides")
    p.add_argument("--compare", required=True, metavar="REV", help="the older code, a git revision of this repository")
    p.add_argument("--grid", type=Path, required=True, help="the grid whose eval: block is measured")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="change keys of the grid's eval block for the measurement")
    p.add_argument("--rounds", type=positive_int, default=1, help="A/B pairs; the side that goes first alternates")
    p.add_argument("--threads", type=positive_int, default=os.cpu_count() or 1, help="CPU threads of each side")
    p.add_argument("--out", type=Path, help="write the figures here (JSON)")
    args = p.parse_args(argv)
    for run in args.runs:
        if not (run / "config.yaml").is_file():
            raise ArgumentError(f"{run}: not a run directory (no config.yaml); give runs/NAME of finished runs")
    if len({r.name for r in args.runs}) != len(args.runs):
        raise ArgumentError("two runs share a directory name; each side's copies are named by it")
    if args.out is not None:
        check_output_file(args.out, "--out")
    return args


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    host = machine()  # before any evaluation: the commit of the code that is measured
    block = grid_eval(args.grid, args.set)
    runs = [r.resolve() for r in args.runs]
    with tempfile.TemporaryDirectory(prefix="ropelab-bench-eval-") as tmp:
        scratch = Path(tmp)
        eval_file = scratch / "eval.yaml"
        eval_file.write_text(yaml.safe_dump(block, sort_keys=False))
        with tree_at(args.compare) as base:
            commits = {"base": git_commit_of(base)}
            rounds = []
            for r in range(args.rounds):
                sides = SIDES if r % 2 == 0 else SIDES[::-1]
                rounds.append({side: evaluate(side, base if side == "base" else ROOT, runs, eval_file, scratch,
                                              args.threads) for side in sides})
    summary = summarize(rounds)
    cells = compare_cells(rounds[0]["base"]["results"], rounds[0]["this"]["results"])
    record = {"machine": host, "compare": {**commits, "this": host["git_commit"]},
              "runs": [str(r) for r in args.runs], "grid": str(args.grid), "eval": block,
              "rounds": [{side: r[side]["seconds"] for side in SIDES} for r in rounds], **summary, "numbers": cells}
    print(f"\nevaluation of {len(runs)} run(s), {cells['cells']} cells: base {summary['base_s']:.1f} s, "
          f"this {summary['this_s']:.1f} s, {summary['speedup']:.2f}× (median of {len(rounds)} round(s))")
    print(f"largest relative difference: perplexity {cells['max_rel_ppl']:.2e}, mean NLL {cells['max_rel_nll']:.2e}"
          + (f"; cells only in base: {len(cells['only_base'])}" if cells["only_base"] else "")
          + (f"; only in this: {len(cells['only_this'])}" if cells["only_this"] else ""))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    moved("python scripts/bench_eval.py", "ropelab bench-eval")
    sys.exit(main())
