"""What a trained run's score bias does with distance: ``ropelab position-bias RUN...``.

For every run whose encoding adds a bias to the attention scores (ALiBi, T5, KERPLE, FIRE),
prints each head's bias at a range of distances for the last query of an L-token window,
relative to the bias on the query's own position (distance 0). Softmax is unchanged by a
constant added to one query's scores, so this relative bias is the whole effect: −5 means
a key at that distance gets e⁻⁵ of the weight it would get at distance 0, other things
equal. ALiBi's is fixed (−slope · d); the learned kinds show what training made of their
parameters, e.g. whether T5's bucket table moved far from its initialisation
(train.pos_lr_multiplier, training/optim.py).

FIRE's bias depends on the query position as well (its distance is normalised by
ψ(max(L_thr, i))); the table is for a query at position L − 1, L = ``--length``
(default: 16 × the run's training length). ``--json`` writes the numbers (at distances
1, 2, 4, … L − 1); ``--plot`` draws every distance, one panel per run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ropelab.eval.lm.plots import plot_position_bias
from ropelab.common.errors import ArgumentError
from ropelab.common.cli import entry_point, positive_int, usage_when_empty, moved
from ropelab.common.logs import get_logger
from ropelab.training.saved_run import load_run

logger = get_logger(__name__)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Each head's attention-score bias against distance, for trained bias-encoding runs.",
        epilog="example: ropelab position-bias runs/pe-extrapolation-cpu-local/t5_seed-* --length 2048")
    p.add_argument("runs", nargs="+", type=Path, help="run directories")
    p.add_argument("--length", type=positive_int, default=None,
                   help="window length L; the query sits at L − 1 (default: 16 × the run's train length)")
    p.add_argument("--which", choices=["latest", "best"], default="latest", help="which weights to load")
    p.add_argument("--json", type=Path, default=None, help="also write the numbers to this file")
    p.add_argument("--plot", type=Path, default=None, help="also draw the biases to this PNG, one panel per run")
    usage_when_empty(p, argv)
    return p.parse_args(argv)


def distances(length: int) -> list[int]:
    """1, 2, 4, … and the longest distance of the window, L − 1."""
    out, d = [], 1
    while d < length - 1:
        out.append(d)
        d *= 2
    return out + [length - 1] if length > 1 else out


def relative_bias(pos: torch.nn.Module, length: int) -> torch.Tensor:
    """(H, L): bias of the query at L − 1 on the key at distance d, minus that at distance 0."""
    pos.check_length(length)
    keys = torch.arange(length)
    row = pos.bias(torch.tensor([length - 1]), keys)[:, 0].float()  # (H, L), key j at column j
    by_distance = row.flip(-1)  # column d: the key at distance d
    return by_distance - by_distance[:, :1]


def markdown(name: str, kind: str, length: int, rel: torch.Tensor, ds: list[int]) -> str:
    lines = [f"{name} ({kind}; query at {length - 1}): bias relative to distance 0",
             "| head | " + " | ".join(f"d={d}" for d in ds) + " |",
             "|---|" + "---|" * len(ds)]
    for h, values in enumerate(rel[:, ds].tolist()):
        lines.append(f"| {h} | " + " | ".join(f"{v:+.2f}" for v in values) + " |")
    return "\n".join(lines)


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    records, panels, skipped = [], [], []
    for run_dir in args.runs:
        run = load_run(run_dir, which=args.which)
        pos, kind = run.model.pos, run.cfg.model.pos.kind
        if not pos.has_bias:
            skipped.append(f"{run_dir} ({kind})")
            continue
        length = args.length or 16 * run.cfg.train.seq_len
        with torch.no_grad():
            rel = relative_bias(pos, length)
        ds = distances(length)
        print(markdown(run_dir.name, kind, length, rel, ds) + "\n")
        records.append({"run": str(run_dir), "encoding": kind, "checkpoint": str(run.checkpoint),
                        "length": length, "distances": ds,
                        "relative_bias": [[round(v, 6) for v in head] for head in rel[:, ds].tolist()]})
        panels.append({"name": run_dir.name, "encoding": kind, "train_len": run.cfg.train.seq_len,
                       "relative_bias": rel.tolist()})
    if skipped:
        logger.warning("no fixed score bias (nothing to show): " + ", ".join(skipped))
    if not records:
        raise ArgumentError("none of the runs adds a bias to the attention scores; this shows the bias "
                            "of pos.kind alibi, t5, kerple or fire runs")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=1) + "\n")
        logger.info(f"wrote {args.json}")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot_position_bias(panels, args.plot)
        logger.info(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    moved("python scripts/position_bias.py", "ropelab position-bias")
    sys.exit(main())
