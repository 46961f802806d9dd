"""Our training against nanoGPT's own, A/B in one sitting:
``ropelab bench-nanogpt --nanogpt DIR [--rounds N] [--steps 2000]``.

nanoGPT (github.com/karpathy/nanoGPT) documents a CPU recipe in its README ("I only have a
macbook"): Tiny Shakespeare characters, 4 layers, 4 heads, d 128, block 64, batch 12,
2,000 iterations, ``--compile=False``, 20 evaluation batches. This script runs nanoGPT's
own ``train.py`` with exactly that command line, and ours with
configs/recipes/nanogpt-shakespeare-char-cpu.yaml (the same data split, shape, optimiser
and schedule; our architecture), eager and compiled (``train.compile=true``), in turn
within each round (the order rotates from round to round, so a machine that speeds up or
slows down during the sitting does not favour one side), with the same number of CPU
threads (``OMP_NUM_THREADS``).

For each run it records the training loop's wall time with everything the loop does
(evaluations, checkpoints and, compiled, the compile itself): nanoGPT's per-iteration
times from its log (``iter N: … time X ms``, evaluation included), ours the
``train_seconds`` of the final checkpoint. Tokens/s is tokens trained over that time
(nanoGPT trains iterations 0 … max_iters, one more than it is told). nanoGPT estimates
its loss on the train and the validation split at each evaluation, so our runs score 40
validation batches (``train.eval_batches=40``) where the recipe scores 20: the same
forward passes. The ratios ours / nanoGPT are taken within each round; the summary gives
their median with a distribution-free 95% interval (eval/reporting/intervals.py ``median_interval``,
6 rounds or more) and the final validation losses of both.

``--paired N`` measures the two models' training steps instead, in one process: nanoGPT's
``GPT`` from the checkout's ``model.py`` (the recipe's shape, its own ``configure_optimizers``,
gradient clipping at 1.0) and ours (configs/bench-small.yaml, the same recipe, through our
Trainer; ``--kinds`` picks our encodings, by default that config's own), on random tokens,
one step each in turn N times, so that the machine's drift falls on all alike. It gives the
median step times, the median of the N paired ratios with a 95% interval, and each step's
costliest operators (torch.profiler): what separates the two shows up operator by operator,
without the data loading, evaluation and checkpoints a whole run adds.

Needs a nanoGPT checkout with its Shakespeare data prepared
(``python data/shakespeare_char/prepare.py`` inside it); run from the repository root.
Timings on a shared machine mean nothing: run it on a quiet one (docs/benchmarks.md).

The command line only; the engine is bench/nanogpt.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from ropelab.bench.nanogpt import SIDES, paired_steps, print_paired, run_side, summarize
from ropelab.bench.run import machine
from ropelab.bench.trees import git_commit_of
from ropelab.common.cli import check_output_file, entry_point, positive_int, moved
from ropelab.common.errors import ArgumentError
from ropelab.common.logs import get_logger
from ropelab.model.config import POS_KINDS

logger = get_logger(__name__)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ropelab bench-nanogpt", description=__doc__.split("\n\n")[0])
    p.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout with data/shakespeare_char prepared")
    p.add_argument("--rounds", type=positive_int, default=6, help="A/B rounds (6 or more give a 95%% interval)")
    p.add_argument("--steps", type=positive_int, default=2000, help="training steps per run (the recipe's 2,000)")
    p.add_argument("--threads", type=positive_int, default=os.cpu_count() or 1, help="CPU threads for every run")
    p.add_argument("--sides", nargs="+", choices=SIDES[1:], default=list(SIDES[1:]),
                   help="which of our runs to set against nanoGPT's")
    p.add_argument("--paired", type=positive_int, metavar="N",
                   help="instead of whole runs: N training steps of each model in turn in one process, "
                        "with their profiles")
    p.add_argument("--kinds", nargs="+", default=None, choices=POS_KINDS,
                   help="with --paired: our encodings to step beside nanoGPT's (default: configs/bench-small.yaml's; "
                        "nanoGPT's own block has learned positions)")
    p.add_argument("--out", type=Path, help="write every run's figures here (JSON)")
    return p.parse_args(argv)


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    if not (args.nanogpt / "train.py").is_file() or not (args.nanogpt / "data/shakespeare_char/train.bin").is_file():
        raise ArgumentError(f"--nanogpt {args.nanogpt}: needs nanoGPT's train.py and its prepared Shakespeare data "
                            "(run python data/shakespeare_char/prepare.py inside the checkout)")
    if args.out is not None:
        check_output_file(args.out, "--out")
    if args.paired:
        torch.set_num_threads(args.threads)
        found = paired_steps(args.nanogpt.resolve(), args.paired, kinds=tuple(args.kinds or ()))
        print_paired(found)
        if args.out is not None:
            args.out.write_text(json.dumps({"machine": machine(), "nanogpt_commit": git_commit_of(args.nanogpt) or None,
                                            "threads": args.threads, "paired": found}, indent=1))
        return 0
    sides = ["nanogpt", *args.sides]
    rounds: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="bench-nanogpt-") as scratch:
        for k in range(args.rounds):
            order = sides[k % len(sides):] + sides[:k % len(sides)]  # rotate who goes first
            found = {side: run_side(side, args.steps, args.nanogpt.resolve(), args.threads, Path(scratch))
                     for side in order}
            rounds.append(found)
            logger.info(f"round {k + 1}/{args.rounds}: " + ", ".join(
                f"{s} {found[s]['tokens_per_sec']:,.0f} tok/s ({found[s]['seconds']:.1f} s, val {found[s]['val_loss']})"
                for s in sides))
    summary = summarize(rounds)
    for name, found in summary.items():
        interval = found["interval"]
        spread = f" (95% interval {interval[0]:.3f}–{interval[1]:.3f})" if interval else " (fewer than 6 rounds: no interval)"
        print(f"{name}: ×{found['median']:.3f}{spread}")
    if args.out is not None:
        args.out.write_text(json.dumps({"machine": machine(), "nanogpt_commit": git_commit_of(args.nanogpt) or None,
                                        "steps": args.steps,
                                        "threads": args.threads, "rounds": rounds, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    moved("python scripts/bench_nanogpt.py", "ropelab bench-nanogpt")
    sys.exit(main())
