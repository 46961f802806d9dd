"""Speed and memory against the machine's own limit: ``ropelab bench [--shapes …]``.

For two shapes (``--shapes``): ``bench`` (configs/bench.yaml: d_model 256, 4 layers, 4
heads, vocab 8192, 16 × 256 tokens per step) and ``small`` (configs/bench-small.yaml:
nanoGPT's CPU recipe, d_model 128, 4 layers, 4 heads, 12 × 64 tokens, 65 characters),
or any run config (``--config``), and every positional encoding (``--kinds``) under each attention
kind asked for (``--attention softmax linear``; rows named ``rope``, ``linear+rope``, …;
pairs the model refuses, such as linear attention with a score bias, are skipped with the
reason), measures

- training: steady-state tokens/s of ``training.trainer.Trainer.train_step`` (the training loop's own
  step: sampler, forward, loss, backward, clipping, AdamW) and model FLOPs utilisation,
  where the peak is the matmul rate this script measures on this machine just before
  (float32 on CPU, the autocast dtype on GPU), so MFU is a ratio to the machine's own limit;
- the same step under ``torch.compile`` (section ``compile``), and its speed-up over eager
  steps taken in turn with it in the same process;
- decoding: greedy generation of 64, 256 and 1024 tokens with and without the KV cache, and
  the per-token latency at the start (tokens 1–64) and end (the last 64) of the longest;
- evaluation: perplexity throughput (eval/lm/perplexity.py, non-overlapping windows) at 1×, 4×
  and 16× the training length;
- peak resident memory of each measurement (Linux: the high-water mark is reset before each
  one through /proc/self/clear_refs; on CUDA also the allocator's peak).

Figures are medians over ``--repeats`` timed repeats after warm-up. Each (section, encoding)
runs in a fresh process (bench/worker.py) so one measurement's memory or compiled
graphs cannot leak into the next. The table goes to stdout and everything, with the
machine, torch version and git commit, to ``--out`` (JSON). Timings on a shared machine
are noisy: compare ratios from one run, and see that nothing else is running.

``--compare REV`` is an A/B in one run: each measurement runs with the same worker file
against the code at REV (a temporary git worktree) and against this tree, back to back,
and the table shows both and their ratio. On a shared machine one process can run up to
1.5× faster than the next with the same code, so ``--rounds N`` repeats the pair N times,
alternating which side goes first, and reports the median of the N paired ratios with
its distribution-free 95% interval (eval/reporting/intervals.py ``median_interval``; 6 rounds or more).

Training steps run on random tokens, except for a synthetic-task config
(``data.source: synthetic``), whose step draws its task's instances as training does.

``learned`` needs a table as long as the longest sequence measured; the benchmark gives
it one (its speed, not its quality, is measured here) and says so in the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator, Optional

import torch

from ropelab import configs
from ropelab.configs import load_config
from ropelab.model.config import ATTENTION_KINDS, POS_KINDS
from ropelab.common.errors import ConfigError, UserError
from ropelab.eval.reporting.intervals import median_interval
from ropelab.bench.report import headline, print_comparison, print_shape
from ropelab.bench.worker import PROMPT, bench_config, run_section, variant_name
from ropelab.common.cli import check_output_file, entry_point, moved
from ropelab.training.memory import check_fits, check_training, decoding_estimate, forward_estimate
from ropelab.training.provenance import git_commit
from ropelab.training.runtime import resolve_device
from ropelab.training.validation import windows_per_batch

SECTIONS = ["train", "compile", "decode", "eval"]
EVAL_BATCH = 8  # windows per forward in section_eval: eval/lm/perplexity.py's default batch_size
SHAPES = {"bench": "bench.yaml", "small": "bench-small.yaml"}
ROOT = Path(__file__).resolve().parents[1]  # the tree whose code "this" measures
WORKER = "ropelab.bench.worker"  # run with python -m, in a fresh process


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.exists():
        cpu = next((line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                    if line.startswith("model name")), cpu)
    mem = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "ram_gb": mem, "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "git_commit": git_commit(),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def spec_for(args: argparse.Namespace, config: Path) -> dict:
    """What a worker needs to rebuild the measurement (JSON-safe)."""
    keys = ("set", "repeats", "warmup", "decode_lengths", "decode_repeats", "eval_multipliers", "eval_tokens",
            "eval_repeats", "profile")
    return {"config": str(config), **{k: getattr(args, k) for k in keys}}


def measure(spec: dict, section: str, row: str, tree: Optional[Path], in_process: bool) -> dict:
    """One measurement: in this process, or in a fresh one against ``tree``'s code."""
    if in_process:
        try:
            return run_section(SimpleNamespace(**spec), section, row)
        except (UserError, RuntimeError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-m", WORKER, json.dumps(spec), section, row],
                          capture_output=True, text=True, env=env, cwd=tree or Path.cwd())
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def plan_variants(args: argparse.Namespace, spec: dict) -> tuple[list[str], dict[str, str]]:
    """The rows to measure, and the pairs the model refuses with its reason (skipped).

    A bad config (unknown key, wrong type) fails here, before any measurement; a pair that
    only this encoding and attention kind make impossible is skipped and reported.
    """
    load_config(spec["config"], args.set)
    names = [variant_name(a, k) for a in args.attention for k in args.kinds] if args.attention else args.kinds
    variants, skipped = [], {}
    for name in names:
        try:
            bench_config(SimpleNamespace(**spec), name)
            variants.append(name)
        except ConfigError as e:
            skipped[name] = str(e)
            print(f"skipping {name}: {e}", file=sys.stderr, flush=True)
    if not variants:
        raise ConfigError("no encoding and attention kind asked for can be measured (each was refused above)")
    return variants, skipped


def check_memory(args: argparse.Namespace, spec: dict, variants: list[str]) -> None:
    """Refuse, before any worker starts, a measurement that cannot fit in memory
    (training/memory.py): a training step of the shape, the longest evaluation
    (``--eval-multipliers``) and the longest generation (``--decode-lengths``)."""
    for row in variants:
        cfg = bench_config(SimpleNamespace(**spec), row)
        device = resolve_device(cfg.train.device)
        if {"train", "compile"} & set(args.sections):
            check_training(cfg, device)
        if "eval" in args.sections:
            length = cfg.train.seq_len * max(args.eval_multipliers)
            batch = windows_per_batch(length, EVAL_BATCH)
            check_fits(forward_estimate(cfg.model, batch, length, f"the benchmark's {row} evaluation at "
                                        f"{length:,} tokens ({batch} window{'s' if batch > 1 else ''} per forward)"),
                       device, "Give smaller --eval-multipliers.")
        if "decode" in args.sections:
            total = PROMPT + max(args.decode_lengths)
            check_fits(decoding_estimate(cfg.model, 1, PROMPT, total,
                                         f"the benchmark's {row} generation of {total:,} tokens"),
                       device, "Give shorter --decode-lengths.")


@contextlib.contextmanager
def tree_at(rev: str) -> Iterator[Path]:
    """A temporary git worktree of ``rev``, removed afterwards."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise UserError(f"--compare {rev}: not a commit of this repository ({sha.stderr.strip()})")
    path = Path(tempfile.mkdtemp(prefix="ropelab-bench-base-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), sha.stdout.strip()], cwd=ROOT,
                   check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, capture_output=True)


def compare(spec: dict, section: str, row: str, base: Path, rounds: int) -> dict:
    """``rounds`` A/B pairs of one measurement, in fresh processes, the side that goes first
    alternating (drift in the machine's speed then falls on both sides alike).

    ``base`` and ``this`` are each side's median measurement (its full record, profile
    included); ``rounds`` the headline figures (bench_report.headline) of every pair;
    ``ratio`` the median of the paired ratios this / base with its 95% interval.
    """
    runs: dict[str, list[dict]] = {"base": [], "this": []}
    for r in range(rounds):
        for side in (("base", "this") if r % 2 == 0 else ("this", "base")):
            runs[side].append(measure(spec, section, row, base if side == "base" else ROOT, False))
    pairs = [{side: headline(runs[side][r], section) for side in runs} for r in range(rounds)]
    ratios = [p["this"] / p["base"] for p in pairs if p["this"] and p["base"]]
    interval = median_interval(ratios)
    return {**{side: median_record(records, section) for side, records in runs.items()},
            "rounds": pairs,
            "ratio": {"median": statistics.median(ratios) if ratios else None, "pairs": len(ratios),
                      "low": interval and interval[0], "high": interval and interval[1]}}


def median_record(records: list[dict], section: str) -> dict:
    """The record whose headline figure is the median (the lower middle of an even count);
    the first error when every record is one."""
    ok = sorted((r for r in records if headline(r, section) is not None), key=lambda r: headline(r, section))
    return ok[(len(ok) - 1) // 2] if ok else records[0]


def shapes_of(args: argparse.Namespace) -> dict[str, Path]:
    if args.config is not None:
        return {"config": args.config}
    return {name: Path(configs.__file__).parent / SHAPES[name] for name in args.shapes}


def run_shapes(args: argparse.Namespace, base: Optional[Path]) -> dict:
    shapes = {}
    for name, config in shapes_of(args).items():
        spec = spec_for(args, config)
        variants, skipped = plan_variants(args, spec)
        check_memory(args, spec, variants)
        shape = {"config": str(config), "overrides": args.set, "kinds": variants, "skipped": skipped,
                 "learned_table": "sized to the longest sequence measured"}
        for section in args.sections:
            shape[section] = {}
            for row in variants:
                print(f"{name:<6} {section:<8} {row} …", file=sys.stderr, flush=True)
                if base is None:
                    shape[section][row] = measure(spec, section, row, None, args.in_process)
                else:
                    shape[section][row] = compare(spec, section, row, base, args.rounds)
        shapes[name] = shape
    return shapes


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="ropelab speed and memory benchmark",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES),
                   help="bench: configs/bench.yaml; small: configs/bench-small.yaml (nanoGPT's CPU recipe)")
    p.add_argument("--config", type=Path, default=None, help="measure this run config instead of --shapes")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="config overrides, e.g. --set model.n_kv_heads=2 train.batch_size=8")
    p.add_argument("--kinds", nargs="+", default=list(POS_KINDS), choices=POS_KINDS, help="encodings to measure")
    p.add_argument("--attention", nargs="+", choices=ATTENTION_KINDS, default=None,
                   help="attention kinds to measure, each with every encoding it can serve "
                        "(default: the config's model.attention)")
    p.add_argument("--sections", nargs="+", default=SECTIONS, choices=SECTIONS, help="what to measure")
    p.add_argument("--repeats", type=int, default=10, help="timed training steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed training steps after the first")
    p.add_argument("--decode-lengths", type=int, nargs="+", default=[64, 256, 1024], help="tokens generated")
    p.add_argument("--decode-repeats", type=int, default=3, help="timed generations per length")
    p.add_argument("--eval-multipliers", type=int, nargs="+", default=[1, 4, 16],
                   help="evaluation lengths, in training lengths")
    p.add_argument("--eval-tokens", type=int, default=32768, help="tokens scored per length")
    p.add_argument("--eval-repeats", type=int, default=3, help="timed evaluations per length")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also profile training steps and report the N operators with the most self time")
    p.add_argument("--compare", metavar="REV", help="A/B in one run against the code at git revision REV")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --compare: A/B pairs per measurement, alternating which goes first; the "
                        "ratio is their median, with a 95%% interval from 6 rounds on")
    p.add_argument("--out", type=Path, default=Path("reports") / "bench.json", help="JSON output")
    p.add_argument("--in-process", action="store_true", help="no worker processes (debugging, tests)")
    args = p.parse_args(argv)
    for name in ("repeats", "decode_repeats", "eval_repeats", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.decode_lengths) < 1 or min(args.eval_multipliers) < 1 or args.warmup < 0 or args.profile < 0:
        p.error("decode lengths and eval multipliers must be positive, --warmup and --profile >= 0")
    check_output_file(args.out, "--out")
    if args.compare and args.in_process:
        p.error("--compare runs every measurement in a fresh process; drop --in-process")
    if args.rounds > 1 and not args.compare:
        p.error("--rounds repeats an A/B pair; it needs --compare REV")
    return args


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    results = {"machine": machine()}
    with tree_at(args.compare) if args.compare else contextlib.nullcontext() as base:
        if base is not None:
            results["compare"] = {"base": git_commit_of(base), "this": results["machine"]["git_commit"]}
        results["shapes"] = run_shapes(args, base)
    if base is None:
        m = results["machine"]
        print(f"\n{m['cpu']} · {m['torch_threads']} threads · torch {m['torch']} · commit {m['git_commit']}")
        for name, shape in results["shapes"].items():
            print_shape(name, shape)
    else:
        print_comparison(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}")
    return 0


def git_commit_of(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    moved("python scripts/bench.py", "ropelab bench")
    sys.exit(main())
