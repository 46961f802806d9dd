"""Generate text from a trained run: ``python scripts/sample.py RUN_DIR --prompt "..."``.

Loads the run's saved config, tokenizer and weights (latest checkpoint, or ``--which
best``), then samples with the KV cache. RoPE scaling can be switched on for long
generations without retraining, e.g. ``--scaling yarn --factor 4``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from model.config import SCALING_TYPES, RopeScalingConfig
from model.generate import generate
from training.cli import entry_point
from training.saved_run import load_run, rescaled


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Sample from a trained ropelab run.")
    p.add_argument("run_dir", type=Path, help="a run directory, e.g. runs/quickstart")
    p.add_argument("--prompt", default="", help="text to continue (empty: start of a document)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--which", choices=["latest", "best"], default="latest", help="which weights to load")
    p.add_argument("--scaling", choices=SCALING_TYPES, default=None,
                   help="RoPE context extension for long generations (RoPE runs only)")
    p.add_argument("--factor", type=float, default=None, help="scaling factor (default: needed length / train length)")
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    run = load_run(args.run_dir, which=args.which, device=args.device)
    tok = run.tokenizer
    # Documents follow an end-of-text token in training, so a prompt starts with one.
    prompt = [tok.eot_id] + (tok.encode(args.prompt) if args.prompt else [])
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
    with torch.inference_mode():
        sys.exit(main())
