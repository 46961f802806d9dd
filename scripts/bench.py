"""Speed and memory against the machine's own limit: ``ropelab bench [--shapes …]``.

For two shapes (``--shapes``): ``bench`` (configs/bench.yaml: d_model 256, 4 layers, 4
heads, vocab 8192, 16 × 256 tokens per step) and ``small`` (configs/bench-small.yaml:
nanoGPT's CPU recipe, d_model 128, 4 layers, 4 heads, 12 × 64 tokens, 65 characters),
or any run config (``--config``), and every positional encoding (``--kinds``) under each attention
kind asked for (``--attention softmax linear``; rows named ``rope``, ``linear+rope``, …;
pairs the model refuses, such as linear attention with a score bias, are skipped with the
reason), and the layer plans asked for (``--plans gemma3 nope-every-4th``: the preset
configs/pe/NAME.yaml merged over the shape, rows ``plan:NAME``), measures

- training: steady-state tokens/s of ``training.trainer.Trainer.train_step`` (the training loop's own
  step: sampler, forward, loss, backward, clipping, AdamW) and model FLOPs utilisation,
  where the peak is the matmul rate this script measures on this machine just before
  (float32 on CPU, the autocast dtype on GPU), so MFU is a ratio to the machine's own limit;
- the same step under ``torch.compile`` (section ``compile``), and its speed-up over eager
  steps taken in turn with it in the same process;
- decoding: greedy generation of 64, 256 and 1024 tokens with and without the KV cache, and
  the per-token latency at the start (tokens 1–64) and end (the last 64) of the longest;
- evaluation: perplexity throughput (eval/lm/perplexity.py, non-overlapping windows) at 1×, 4×
  and 16× the training length, and its FLOP/s as a ratio of the bare forward's (the forward
  a training step takes, same length and windows per forward, timed in the same process):
  a figure that does not depend on the machine's speed (bench/worker.py ``section_eval``);
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
REV may be any commit, before the folders became the ``ropelab`` package (fb1bb84) too
(bench/trees.py says how its code is imported).

Training steps run on random tokens, except for a synthetic-task config
(``data.source: synthetic``), whose step draws its task's instances as training does.

``learned`` needs a table as long as the longest sequence measured; the benchmark gives
it one (its speed, not its quality, is measured here) and says so in the JSON.

The command line only; the engine is bench/run.py, the tables bench/report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from ropelab.bench.report import print_comparison, print_shape
from ropelab.bench.run import SECTIONS, SHAPES, machine, plan_presets, run_shapes
from ropelab.bench.trees import git_commit_of, tree_at
from ropelab.common.cli import check_output_file, entry_point, moved
from ropelab.common.logs import setup_logging
from ropelab.model.config import ATTENTION_KINDS, POS_KINDS


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="ropelab speed and memory benchmark",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES),
                   help="bench: configs/bench.yaml; small: configs/bench-small.yaml (nanoGPT's CPU recipe)")
    p.add_argument("--config", type=Path, default=None, help="measure this run config instead of --shapes")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="config overrides, e.g. --set model.n_kv_heads=2 train.batch_size=8")
    p.add_argument("--kinds", nargs="+", default=list(POS_KINDS), choices=POS_KINDS, help="encodings to measure")
    presets = plan_presets()
    p.add_argument("--plans", nargs="+", default=[], choices=presets, metavar="PRESET",
                   help="also measure these layer plans, each a preset of configs/pe/ merged over the "
                        f"shape (rows plan:PRESET): {', '.join(presets)}")
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
    setup_logging(info_to="stderr")  # stdout is the table
    results = {"machine": machine()}
    with tree_at(args.compare) if args.compare else contextlib.nullcontext() as base:
        if base is not None:
            results["compare"] = {"base": git_commit_of(base.root), "this": results["machine"]["git_commit"]}
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


if __name__ == "__main__":
    moved("python scripts/bench.py", "ropelab bench")
    sys.exit(main())
