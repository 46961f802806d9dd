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
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import torch

from ropelab.common.cli import check_output_file, entry_point, positive_int, moved
from ropelab.common.errors import ArgumentError, UserError
from ropelab.configs import load_config
from ropelab.model.config import POS_KINDS
from ropelab.eval.reporting.intervals import median_interval
from ropelab.scripts.bench import git_commit_of, machine
from ropelab.bench.worker import CHAR_VOCAB, bench_config, step_data, top_ops
from ropelab.training.runtime import setup_runtime, time_calls
from ropelab.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "recipes" / "nanogpt-shakespeare-char-cpu.yaml"
BATCH, BLOCK = 12, 64  # the recipe's shape, on both sides
ITER_LINE = re.compile(r"^iter (\d+): loss ([0-9.]+), time ([0-9.]+)ms")
EVAL_LINE = re.compile(r"^step (\d+): train loss ([0-9.]+), val loss ([0-9.]+)")
SIDES = ("nanogpt", "eager", "compiled")


def nanogpt_command(steps: int, out_dir: Path) -> list[str]:
    """nanoGPT's README CPU recipe, verbatim apart from the step count and where it saves."""
    return [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
            "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4",
            "--n_head=4", "--n_embd=128", f"--max_iters={steps}", f"--lr_decay_iters={steps}", "--dropout=0.0",
            f"--out_dir={out_dir}"]


def ours_command(steps: int, out_dir: Path, compiled: bool) -> list[str]:
    return [sys.executable, "train.py", str(RECIPE), f"train.max_steps={steps}", "train.eval_batches=40",
            f"train.compile={'true' if compiled else 'false'}", f"out_dir={out_dir}", "name=bench",
            "log.progress=false"]


def parse_nanogpt(log: str) -> dict:
    """Loop seconds, tokens and the last validation loss from nanoGPT's stdout."""
    times = [float(m.group(3)) / 1000 for m in map(ITER_LINE.match, log.splitlines()) if m]
    evals = [float(m.group(3)) for m in map(EVAL_LINE.match, log.splitlines()) if m]
    if not times:
        raise UserError("nanoGPT printed no 'iter N: … time X ms' lines; is --nanogpt a nanoGPT checkout?\n"
                        + "\n".join(log.splitlines()[-5:]))
    return {"seconds": sum(times), "tokens": len(times) * BATCH * BLOCK, "val_loss": evals[-1] if evals else None}


def parse_ours(run_dir: Path) -> dict:
    """Loop seconds, tokens and validation loss from our run's final checkpoint."""
    metas = sorted(run_dir.glob("checkpoints/step_*/meta.json"))
    if not metas:
        raise UserError(f"{run_dir} has no checkpoint; the run failed (see its train.log)")
    meta = json.loads(metas[-1].read_text())
    return {"seconds": meta["train_seconds"], "tokens": meta["tokens"], "val_loss": meta.get("val_loss")}


def run_side(side: str, steps: int, nanogpt: Path, threads: int, scratch: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{side}-", dir=scratch))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    cmd, cwd = ((nanogpt_command(steps, out), nanogpt) if side == "nanogpt"
                else (ours_command(steps, out, side == "compiled"), ROOT))
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise UserError(f"the {side} run failed (exit {proc.returncode}):\n{tail}")
    found = parse_nanogpt(proc.stdout) if side == "nanogpt" else parse_ours(out / "bench")
    return {**found, "process_seconds": wall, "tokens_per_sec": found["tokens"] / found["seconds"]}


def summarize(rounds: list[dict[str, dict]]) -> dict:
    out = {}
    for side in ("eager", "compiled"):
        ratios = [r[side]["tokens_per_sec"] / r["nanogpt"]["tokens_per_sec"] for r in rounds if side in r]
        if ratios:
            out[f"{side} / nanogpt"] = {"median": statistics.median(ratios), "interval": median_interval(ratios),
                                        "ratios": ratios}
    return out


def nanogpt_step(nanogpt: Path) -> Callable[[], None]:
    """One training step of nanoGPT's own model at the recipe's shape: forward with its loss,
    backward, clipping at 1.0, its AdamW (``configure_optimizers``), as its train.py does."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", nanogpt / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    conf = module.GPTConfig(block_size=BLOCK, vocab_size=CHAR_VOCAB, n_layer=4, n_head=4, n_embd=128, dropout=0.0,
                            bias=False)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its size and parameter groups
        model = module.GPT(conf)
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    batch = torch.randint(0, CHAR_VOCAB, (BATCH, BLOCK + 1), generator=torch.Generator().manual_seed(0))
    x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()  # as its get_batch stacks them

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


SMALL = ROOT / "configs" / "bench-small.yaml"  # the recipe's shape, as scripts/bench.py measures it


def default_kind() -> str:
    """The encoding of the small shape's own config."""
    return load_config(SMALL).model.pos.kind


def our_step(kind: str) -> Callable[[], None]:
    """One training step of ours at the same recipe (configs/bench-small.yaml) with encoding ``kind``."""
    spec = SimpleNamespace(config=str(SMALL), set=[], eval_multipliers=[1], decode_lengths=[1])
    cfg = bench_config(spec, kind)
    return Trainer(cfg, setup_runtime(cfg.train), data=step_data(cfg)).train_step


def paired_steps(nanogpt: Path, steps: int, warmup: int = 5, profile_ops: int = 12,
                 kinds: Optional[tuple[str, ...]] = None) -> dict:
    """nanoGPT's step and ours (one per encoding of ``kinds``) in turn in this process: median
    times, the paired ratios ours / nanoGPT in tokens/s, profiles."""
    kinds = kinds or (default_kind(),)
    sides = {"nanogpt": nanogpt_step(nanogpt), **{kind: our_step(kind) for kind in kinds}}
    for step in sides.values():
        time_calls(step, 0, warmup, torch.device("cpu"))
    times: dict[str, list[float]] = {side: [] for side in sides}
    for k in range(steps):
        for side in (list(sides) if k % 2 == 0 else list(sides)[::-1]):
            times[side] += time_calls(sides[side], 1, 0, torch.device("cpu"))
    ours = {}
    for kind in kinds:
        ratios = [n / e for n, e in zip(times["nanogpt"], times[kind])]  # > 1: ours is faster
        interval = median_interval(ratios)
        ours[kind] = {"step_ms": statistics.median(times[kind]) * 1e3, "speed_ratio": statistics.median(ratios),
                      "interval": list(interval) if interval else None}
    return {"steps": steps, "nanogpt_step_ms": statistics.median(times["nanogpt"]) * 1e3, "ours": ours,
            "profiles": {side: top_ops(step, profile_ops, steps=5) for side, step in sides.items()}}


def print_paired(found: dict) -> None:
    print(f"one training step of each, {found['steps']} in turn in one process: nanoGPT "
          f"{found['nanogpt_step_ms']:.1f} ms")
    for kind, row in found["ours"].items():
        interval = row["interval"]
        spread = f" (95% interval {interval[0]:.3f}–{interval[1]:.3f})" if interval else ""
        print(f"  ours, {kind}: {row['step_ms']:.1f} ms; ours / nanoGPT tokens/s ×{row['speed_ratio']:.3f}{spread}")
    for side, ops in found["profiles"].items():
        print(f"\nwhere one {side} step spends its time (self CPU, torch.profiler):")
        for op in ops:
            print(f"  {op['share']:6.1%} {op['self_cpu_ms_per_step']:8.2f} ms {op['calls_per_step']:6.0f}×  {op['op']}")


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
            print(f"round {k + 1}/{args.rounds}: " + ", ".join(
                f"{s} {found[s]['tokens_per_sec']:,.0f} tok/s ({found[s]['seconds']:.1f} s, val {found[s]['val_loss']})"
                for s in sides), flush=True)
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
