"""Choose each encoding's setting from a finished sweep grid: ``ropelab tune GRID [--out DIR]``.

The command line only; the choice, its report and the ``more_seeds`` block are grid/tune.py's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ropelab.common.atomic import write_text_atomic
from ropelab.common.cli import entry_point, moved, non_negative_int, usage_when_empty
from ropelab.common.errors import ConfigError
from ropelab.common.logs import get_logger
from ropelab.configs.grid import load_grid
from ropelab.eval.reporting.report_dir import PERPLEXITY, check_report_dir
from ropelab.grid import tune as engine
from ropelab.grid.tune import more_seeds_block, report_text, sweep_seeds, tune

logger = get_logger(__name__)

tune_doc = engine.__doc__


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ropelab tune", description=tune_doc.split("\n\n")[0])
    p.add_argument("grid", type=Path, help="a finished sweep grid (configs/ablations/...)")
    p.add_argument("--out", type=Path, help="where tuning.md and tuning.json go (default: the grid's report directory)")
    p.add_argument("--more-seeds", nargs="+", type=non_negative_int, default=[], metavar="SEED",
                   help="also print a more_seeds block that adds these seeds to every chosen row, for a study "
                        "that grows the sweep grid itself (its other rows stay as ablations at the sweep's seeds)")
    usage_when_empty(p, argv)
    return p.parse_args(argv)


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    grid = load_grid(args.grid)
    if not grid.axes.get("train.seed") and not grid.more_seeds:
        raise ConfigError(f"{args.grid}: a sweep needs seeds (axes: train.seed: [0, 1, ...]) to tell settings apart "
                          "across training runs")
    taken = sweep_seeds(grid, grid.plan()) & set(args.more_seeds)
    if taken:  # refused before anything is read or written
        raise ConfigError(f"--more-seeds {' '.join(map(str, args.more_seeds))}: seeds "
                          f"{', '.join(map(str, sorted(taken)))} are the sweep's own; give new ones")
    out = args.out or grid.report_dir
    check_report_dir(out, PERPLEXITY, tool="ropelab tune")  # its record goes beside the grid's perplexity report
    found = tune(grid)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "tuning.json", json.dumps(found, indent=1))
    write_text_atomic(out / "tuning.md", report_text(found))
    print(report_text(found))
    print("chosen, as variant lines for a study grid:")
    for encoding, entry in found["encodings"].items():
        chosen = entry["rows"][entry["chosen"]]
        print(f"  {encoding}: [{', '.join(chosen['overrides'])}]")
    for encoding, entry in found["encodings"].items():
        for edge in entry["edges"]:
            print(f"  note: {encoding} was chosen at the edge of its sweep: {edge}")
    if args.more_seeds:
        print("\nmore seeds for the chosen rows, as a block for the grid file"
              + (" (it replaces the grid's own more_seeds block, whose seeds it keeps)" if grid.more_seeds else "")
              + ":\nmore_seeds:")
        for row, seeds in more_seeds_block(grid, found, args.more_seeds).items():
            print(f"  {row}: [{', '.join(map(str, seeds))}]")
    logger.info(f"\nwrote {out / 'tuning.md'} and {out / 'tuning.json'}")
    return 0


if __name__ == "__main__":
    moved("python scripts/tune.py", "ropelab tune")
    sys.exit(main())
