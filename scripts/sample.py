"""Generate text from a trained run: ``ropelab sample RUN_DIR --prompt "..."``.

Loads the run's saved config, tokenizer and weights (latest checkpoint, or ``--which
best``), then samples with the KV cache. RoPE scaling can be switched on for long
generations without retraining, e.g. ``--scaling yarn --factor 4``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ropelab.model.config import SCALING_TYPES, RopeScalingConfig
from ropelab.model.generate import generate
from ropelab.common.devices import DEVICE_NAMES
from ropelab.common.errors import ArgumentError
from ropelab.common.cli import (moved, device_name, entry_point, non_negative_float, positive_int, probability, scale_factor,
                          usage_when_empty)
from ropelab.training.memory import check_fits, decoding_estimate
from ropelab.training.runtime import resolve_device
from ropelab.training.saved_run import load_run, rescaled


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Sample from a trained ropelab run.")
    p.add_argument("run_dir", type=Path, help="a run directory, e.g. runs/quickstart")
    p.add_argument("--prompt", default="", help="text to continue (empty: start of a document)")
    p.add_argument("--max-new-tokens", type=positive_int, default=200, help="tokens to generate per sample")
    p.add_argument("--temperature", type=non_negative_float, default=0.8,
                   help="softmax temperature; 0 = greedy (always the most likely token)")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample among the k most likely tokens only")
    p.add_argument("--top-p", type=probability, default=0.95,
                   help="nucleus sampling: the smallest set of tokens with this total probability, in (0, 1]")
    p.add_argument("--seed", type=int, default=None, help="random seed (sample i uses seed + i); default: random")
    p.add_argument("--num-samples", type=positive_int, default=1, help="how many samples to print")
    p.add_argument("--which", choices=["latest", "best"], default="latest", help="which weights to load")
    p.add_argument("--scaling", choices=SCALING_TYPES, default=None,
                   help="RoPE context extension for long generations (RoPE runs only)")
    p.add_argument("--factor", type=scale_factor, default=None,
                   help="scaling factor >= 1 (default: needed length / train length)")
    p.add_argument("--device", type=device_name, default="cpu", help=f"torch device: {DEVICE_NAMES}")
    usage_when_empty(p, argv)
    return p.parse_args(argv)


@entry_point
@torch.inference_mode()
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.factor is not None and not args.scaling:
        raise ArgumentError("--factor needs --scaling (e.g. --scaling yarn --factor 4)")
    device = resolve_device(args.device, "--device")
    run = load_run(args.run_dir, which=args.which, device=device)
    tok = run.tokenizer
    # Documents follow an end-of-text token in training, so a prompt starts with one.
    prompt = [tok.eot_id] + (tok.encode(args.prompt) if args.prompt else [])
    total = len(prompt) + args.max_new_tokens
    run.model.check_length(total)  # a learned table's limit, said as such, before the memory
    check_fits(decoding_estimate(run.cfg.model, 1, len(prompt), total,
                                 f"sampling {args.max_new_tokens:,} tokens after a {len(prompt):,}-token prompt"),
               device, "Ask for fewer tokens (--max-new-tokens) or give a shorter --prompt.")
    if args.scaling:
        train_len = run.cfg.train.seq_len
        factor = args.factor or max(1.0, (len(prompt) + args.max_new_tokens) / train_len)
        scaling = RopeScalingConfig(type=args.scaling, factor=factor, original_max_len=train_len)
        run.model = rescaled(run, scaling)
    for i in range(args.num_samples):
        seed = None if args.seed is None else args.seed + i
        out = generate(run.model, prompt, args.max_new_tokens, temperature=args.temperature,
                       top_k=args.top_k, top_p=args.top_p, seed=seed, eos_id=tok.eot_id)
        text = tok.decode([t for t in out[0, 1:].tolist() if t != tok.eot_id])
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        print(text)
    return 0


if __name__ == "__main__":
    moved("python scripts/sample.py", "ropelab sample")
    sys.exit(main())
