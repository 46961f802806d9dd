"""Export a RoPE run to Hugging Face transformers, or import a transformers Llama as a run.

    ropelab export RUN_DIR OUT_DIR [--which best] [--scaling yarn --factor 4] [--check [--tolerance 1e-4]]
    ropelab export --import HF_DIR RUN_DIR

The export loads with ``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` as a
``LlamaForCausalLM`` and with ``AutoTokenizer.from_pretrained(OUT_DIR)``. The import writes
a run directory that ``ropelab eval`` and ``scripts/sample.py`` read. The
mapping is model/llama_mapping.py; reading and writing directories training/hf_directory.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ropelab.model.config import SCALING_TYPES, RopeScalingConfig
from ropelab.common.errors import ArgumentError
from ropelab.common.cli import (check_output_dir, entry_point, moved, positive_float, positive_int, scale_factor,
                                usage_when_empty)
from ropelab.common.logs import get_logger
from ropelab.training.hf_directory import EXPORT_FILES, check_parity, check_parity_memory, export_run, import_hf
from ropelab.training.run_dir import RunDir
from ropelab.training.saved_run import read_run_config

logger = get_logger(__name__)

# Both sides compute in float32 on the CPU: the project's parity tests hold the logits of a
# transformers Llama within 1e-4 of ours (tests/unit/test_hf.py), and an export of the
# WikiText-2 RoPE run differs by ~7e-6; a wrong weight or rotary table differs by far more.
CHECK_TOLERANCE = 1e-4


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Export a RoPE run to Hugging Face transformers (Llama), "
                                            "or import one with --import.")
    p.add_argument("source", type=Path, help="RUN_DIR to export (with --import: a transformers Llama directory)")
    p.add_argument("dest", type=Path, help="OUT_DIR to create (with --import: the run directory to create)")
    p.add_argument("--import", dest="do_import", action="store_true",
                   help="import a transformers Llama directory as a ropelab run")
    p.add_argument("--which", choices=["latest", "best"], default="latest", help="which weights to export")
    p.add_argument("--scaling", choices=SCALING_TYPES, default=None,
                   help="RoPE context extension written into the exported config")
    p.add_argument("--factor", type=scale_factor, default=None, help="scaling factor s >= 1 (with --scaling)")
    p.add_argument("--original-max-len", type=positive_int, default=None,
                   help="training length the scaling extends (default: the run's train.seq_len)")
    p.add_argument("--check", action="store_true",
                   help="load the export in transformers and compare logits: the max |difference|, then pass "
                        "or fail against --tolerance (exit 1 on fail; needs .[hf])")
    p.add_argument("--tolerance", type=positive_float, default=CHECK_TOLERANCE,
                   help="the largest |logit difference| --check passes (float32 on both sides)")
    p.add_argument("--check-length", type=positive_int, default=None,
                   help="tokens for --check (default: 2 x train length)")
    usage_when_empty(p, argv)
    return p.parse_args(argv)


def _scaling(args: argparse.Namespace) -> RopeScalingConfig | None:
    if args.scaling is None:
        if args.factor is not None:
            raise ArgumentError("--factor needs --scaling (e.g. --scaling yarn --factor 4)")
        return None
    if args.scaling != "none" and args.factor is None:
        raise ArgumentError(f"--scaling {args.scaling} needs --factor (the context extension, e.g. 4)")
    run = RunDir(args.source)
    if not run.is_run():
        return None  # not a run: export_run says so
    original = args.original_max_len or read_run_config(run).train.seq_len
    return RopeScalingConfig(type=args.scaling, factor=args.factor or 1.0, original_max_len=original)


@entry_point
@torch.inference_mode()
def main(argv=None) -> int:
    args = parse_args(argv)
    check_output_dir(args.dest, "OUT_DIR")
    if args.do_import:
        notes = import_hf(args.source, args.dest)
    else:
        scaling = _scaling(args)
        if args.check and RunDir(args.source).is_run():
            check_parity_memory(read_run_config(RunDir(args.source)), args.check_length)
        notes = export_run(args.source, args.dest, which=args.which, scaling=scaling)
    for note in notes:
        logger.info(f"note: {note}")
    logger.info(f"wrote {args.dest}" + ("" if args.do_import else f": {', '.join(EXPORT_FILES)}"))
    if args.check and not args.do_import:
        diff, length = check_parity(args.source, args.dest, args.which, scaling, args.check_length)
        verdict = "pass" if diff <= args.tolerance else "FAIL"
        print(f"check: max |logit difference| vs transformers over {length} random tokens: {diff:.3g}; "
              f"{verdict} (tolerance {args.tolerance:g})")
        return 0 if diff <= args.tolerance else 1
    return 0


if __name__ == "__main__":
    moved("python scripts/export_hf.py", "ropelab export")
    sys.exit(main())
