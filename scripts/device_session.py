"""A lent machine's session in one command: ``ropelab device-session GRID --budget 12m --out DIR``.

Trains and evaluates as many of the grid's runs as fit in the budget (``ropelab ablate --until``
with the deadline a margin before its end, on the GPU when there is one), optionally benchmarks
the grid's shape (``--bench``: ``ropelab bench --config`` the grid's base, its training and
evaluation sections, JSON beside the records), and leaves the records written in the session
and a session.json in DIR to bring back (grid/device_session.py). Everything it needs is local:
run it on a machine with the project, its wheels and the corpora the grid reads
(docs/cluster.md, "A lent machine"). Copy DIR/records/<grid>/* into the grid's archive on your
machine and the runs are done there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

from ropelab.common.cli import entry_point, moved, usage_when_empty
from ropelab.common.logs import get_logger
from ropelab.configs.grid import load_grid
from ropelab.grid.deadline import deadline_arg
from ropelab.grid.device_session import check_session, collect
from ropelab.grid.runner import run_grid
from ropelab.scripts import ablate
from ropelab.training.provenance import git_commit

logger = get_logger(__name__)
MARGIN = 0.1  # of the budget, kept after the deadline: the last checkpoint, the records, the copy


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ropelab device-session", description=__doc__.split("\n\n")[0],
                                epilog="example: ropelab device-session configs/ablations/core-gpu-local.yaml "
                                       "--budget 12m --out device-out --rows 'rope*' 'alibi*'")
    p.add_argument("grid", type=Path, help="a grid file with an archive: directory")
    p.add_argument("--budget", required=True, type=deadline_arg, metavar="DURATION",
                   help="the time the session may take, e.g. 12m or 1h30m")
    p.add_argument("--out", required=True, type=Path, help="the folder to bring back (records, session.json)")
    p.add_argument("--rows", nargs="+", default=None, metavar="PATTERN", help="only these rows, as ropelab ablate")
    p.add_argument("--bench", action="store_true", help="also benchmark the grid's shape (train, eval) into "
                                                        "DIR/bench.json, before the grid")
    usage_when_empty(p, argv)
    return p.parse_args(argv)


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    grid = load_grid(args.grid)
    check_session(grid, args.out)
    budget = args.budget - started  # deadline_arg: the end of the budget as a time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    bench = None
    if args.bench:
        bench = args.out / "bench.json"
        subprocess.run([sys.executable, "-m", "ropelab.scripts.cli", "bench", "--config", str(grid.base),
                        "--sections", "train", "eval", "--out", str(bench)], check=False)
    deadline = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started + (1 - MARGIN) * budget))
    device = ["--devices", "cuda"] if torch.cuda.is_available() else []
    grid_args = [str(args.grid), "--until", deadline, *device, *(["--rows", *args.rows] if args.rows else [])]
    logger.info(f"device session: {args.grid} until {deadline}, records to {args.out}")
    code = run_grid(ablate.parse_args(grid_args))
    summary = collect(grid, started, args.out, git_commit(), code, bench)
    print(f"{len(summary['records'])} runs finished and recorded in {args.out / 'records' / grid.name} "
          f"({summary['seconds']:.0f} s); copy them into {grid.archive} on your machine")
    return code


if __name__ == "__main__":
    moved("python scripts/device_session.py", "ropelab device-session")
    sys.exit(main())
