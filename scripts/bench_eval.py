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

The command line only; the engine is bench/eval_ab.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import yaml

from ropelab.bench.eval_ab import SIDES, compare_cells, evaluate, grid_eval, summarize
from ropelab.bench.run import machine
from ropelab.bench.trees import THIS, git_commit_of, tree_at
from ropelab.common.cli import check_output_file, entry_point, positive_int, moved
from ropelab.common.errors import ArgumentError
from ropelab.common.logs import setup_logging


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
    setup_logging(info_to="stderr")  # stdout is the summary
    host = machine()  # before any evaluation: the commit of the code that is measured
    block = grid_eval(args.grid, args.set)
    runs = [r.resolve() for r in args.runs]
    with tempfile.TemporaryDirectory(prefix="ropelab-bench-eval-") as tmp:
        scratch = Path(tmp)
        eval_file = scratch / "eval.yaml"
        eval_file.write_text(yaml.safe_dump(block, sort_keys=False))
        with tree_at(args.compare) as base:
            commits = {"base": git_commit_of(base.root)}
            rounds = []
            for r in range(args.rounds):
                sides = SIDES if r % 2 == 0 else SIDES[::-1]
                rounds.append({side: evaluate(side, base if side == "base" else THIS, runs, eval_file, scratch,
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
