"""What attention does as the length grows: ``ropelab diagnose RUN [RUN ...] --out DIR``.

For every run, at its training length L and at each longer length, on a sample of windows
of its own validation split (task instances for a run trained on synthetic tasks): the
attention entropy by query position, the mean and the distribution of attended distance,
the sink mass on the first token with Gu et al.'s ε-threshold sink rate, for RoPE and xPos
the q·k norm per rotation pair, and for passkey the attention on the needle. Runs that are
the same experiment apart from the seed are pooled into one row, with 95% intervals. Writes
report.md, results.json and figures into ``--out``; docs/diagnostics.md explains each measure.

The settings are each run's own ``eval.diagnostics`` (configs/diagnostics.py), which the
flags override; results are cached per run and checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ropelab.common.cli import device_name, entry_point, positive_float, positive_int, usage_when_empty, moved
from ropelab.common.devices import DEVICE_NAMES
from ropelab.common.logs import get_logger
from ropelab.configs import override_section
from ropelab.configs.schema import EvalConfig, RunConfig
from ropelab.eval.diagnostics.measure import DIAGNOSTICS, run_diagnostics
from ropelab.eval.core.evaluation import cached_evaluation, check_requests, merged, read_eval_file
from ropelab.eval.reporting.report_dir import check_report_dir
from ropelab.training.runtime import resolve_device

logger = get_logger(__name__)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Attention diagnostics of trained runs against length: entropy, attended distance, sinks, "
                    "q·k norm per RoPE frequency, attention on a passkey's needle.",
        epilog="example: ropelab diagnose runs/quickstart-rope runs/quickstart-alibi --out reports/diag")
    p.add_argument("runs", nargs="+", type=Path, help="run directories (runs/NAME)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--lengths", type=positive_int, nargs="+",
                       help="eval.diagnostics.lengths (default: 1, 2, 4, 8, 16 × each run's training length; "
                            "the training length is always added)")
    which.add_argument("--length-multipliers", type=positive_float, nargs="+", dest="length_multipliers",
                       help="eval.diagnostics.length_multipliers: lengths as multiples of each run's training "
                            "length, for runs trained at different lengths (e.g. 1 1.5 2 4 8)")
    p.add_argument("--windows", type=positive_int, help="eval.diagnostics.windows: windows per length (default 8)")
    p.add_argument("--epsilon", type=float, help="eval.diagnostics.epsilon: a head is a sink head when its mean "
                                                 "attention on the first token exceeds it (default 0.3)")
    p.add_argument("--sink-tokens", type=positive_int, dest="sink_tokens",
                   help="eval.diagnostics.sink_tokens: how many first tokens the sink mass counts (default 1)")
    p.add_argument("--split", choices=["valid", "test"], help="eval.split: which split of the run's own data")
    p.add_argument("--eval-file", type=Path, help="a YAML mapping of eval keys applied before the flags "
                                                 "(a grid's jobs pass each run's planned evaluation)")
    p.add_argument("--cache-only", action="store_true",
                   help="compute and cache the diagnostics in each run directory, without writing a report "
                        "(what a grid's jobs do)")
    p.add_argument("--device", type=device_name, default="cpu", help=f"torch device: {DEVICE_NAMES}")
    p.add_argument("--out", type=Path, default=Path("reports/diagnostics"),
                   help="report directory: a new one, or an earlier report's, which is replaced")
    usage_when_empty(p, argv)
    return p.parse_args(argv)


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    settings = {key: getattr(args, key) for key in ("lengths", "windows", "epsilon", "sink_tokens", "length_multipliers")
                if getattr(args, key) is not None}
    if args.length_multipliers:
        settings["lengths"] = []  # the multiples rule, whatever lengths a run's own config names
    tree = {"diagnostics": settings} if settings else {}
    if args.split:
        tree["split"] = args.split
    tree = merged(read_eval_file(args.eval_file), tree) if args.eval_file else tree
    override_section(EvalConfig(), tree, "command line", "eval.")  # a bad value fails before any work
    if not args.cache_only:
        check_report_dir(args.out, DIAGNOSTICS.report_kind)
    device = str(resolve_device(args.device, "--device"))

    def eval_for(cfg: RunConfig) -> EvalConfig:
        return override_section(cfg.eval, tree, "command line", "eval.")

    if args.cache_only:
        check_requests(DIAGNOSTICS, args.runs, eval_for, device)
        for run in args.runs:
            cached_evaluation(DIAGNOSTICS, run, eval_for, device)
        return 0
    results = run_diagnostics(args.runs, args.out, eval_for, device=device)
    logger.info(f"wrote {args.out}/report.md, results.json and figures ({len(results['runs'])} runs)")
    return 0


if __name__ == "__main__":
    moved("python scripts/diagnose.py", "ropelab diagnose")
    sys.exit(main())
