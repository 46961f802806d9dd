"""Grid → train → evaluate → report: ``ropelab ablate configs/ablations/NAME.yaml``.

Re-running the same command is always safe: finished runs are skipped, interrupted ones
resume from their last checkpoint, and nothing complete is trained again (evaluations
are cached per run and checkpoint too). Each run trains in its own process, so one
failure does not stop the others; the summary lists what failed and why, and the report
states which runs are missing. Each run's output goes to ``train.log`` in its run
directory. With ``--devices cuda:0 cuda:1 …`` runs are spread one per device; on CPU they
run one after another. A run on disk counts as the grid's when it is the same experiment
(configs/experiment.py), so raising the grid's ``train.max_steps`` continues finished runs.

What is evaluated follows what the runs were trained on: runs trained on text get the
perplexity sweep (eval/lm/extrapolation.py, report in the grid's report directory); runs
trained on synthetic tasks, and text runs whose ``eval.tasks.tasks`` names tasks (passkey),
get task accuracy (eval/tasks/exact_match.py, report in its ``tasks/`` subdirectory); with
``eval.diagnostics.enabled``, the attention diagnostics (eval/diagnostics/measure.py) go into its
``diagnostics/`` subdirectory. Task settings that cannot work (a task longer than a length)
stop the grid before anything trains.

A grid with an ``archive`` directory keeps each run, once trained and evaluated, as a
record without weights there (grid/archive.py): committed, it lets the same command
on a fresh clone restore those runs instead of training them again.

On a cluster, ``--launcher slurm`` submits each run as a Slurm job instead, with the grid's
``slurm:`` resources (grid/slurm_launcher.py, docs/cluster.md); ``--status`` shows where
every run stands, ``--cancel`` stops the grid's jobs, ``--report`` writes the reports once
they have ended.

``--until TIME`` stops taking runs at a deadline (a session's or an allocation's end): a
run starts only while its estimate says it ends by then, and training still under way at
the deadline is stopped at a checkpoint; what was left is continued by the same command
later (grid/deadline.py).

A SIGTERM to this command stops the runs it is training at a checkpoint (train.py saves one
and exits) and starts no other; it says so and exits 143, and the same command continues.
Two such commands on one grid never train a run twice: a run the other is training is listed
as running elsewhere (not a failure), and the reports wait until it has finished; a report
written while runs are missing (``--report``, ``--rows``) says it is incomplete and how to
write it again with them.

``--rows PATTERN …`` trains and evaluates only the rows it names (shell-style patterns on
run names without their ``seed-N`` part, e.g. ``--rows rope 'fire-*'``, or on whole run
names, e.g. one parent's fine-tunes by ``'*_seed-0_*'``): a long grid's headline rows first,
the rest later by the same command without it. The reports are still
written from every finished run of the grid; the rows left out are listed as not finished,
not as failures.

The command line only; the engine is grid/runner.py.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from ropelab.common.cli import device_name, entry_point, positive_int, usage_when_empty, moved
from ropelab.common.errors import UserError
from ropelab.common.logs import get_logger
from ropelab.grid.deadline import deadline_arg, negative_until
from ropelab.grid.local import sigterm_stops_jobs, stopped
from ropelab.grid.runner import run_grid
from ropelab.grid.slurm_launcher import check_slurm
from ropelab.training.runtime import resolve_device

logger = get_logger(__name__)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("grid", type=Path, help="a grid file, e.g. configs/ablations/pe-extrapolation-cpu.yaml")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their state, do nothing")
    p.add_argument("--devices", nargs="+", type=device_name, default=None,
                   help="train runs in parallel, one per device (e.g. cuda:0 cuda:1; cpu cpu is --jobs 2); "
                        "default: --jobs")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="runs trained and evaluated at once on the CPU, each with usable CPUs/jobs threads "
                        "(the CPUs this process may run on)")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads per job (default: usable CPUs / jobs)")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides for every run (part of the runs' identity)")
    p.add_argument("--skip-eval", action="store_true", help="train only")
    p.add_argument("--no-estimate", action="store_true",
                   help="skip the time estimate (it times each distinct shape once, cached, before training)")
    p.add_argument("--launcher", choices=["local", "slurm"], default="local",
                   help="local: train here (--jobs, --devices); slurm: submit each run as a Slurm job through "
                        "submitit, with the grid's slurm: resources (docs/cluster.md)")
    p.add_argument("--slurm", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override the grid's slurm: resources, e.g. time=8:00:00 partition=gpu sbatch.qos=high")
    p.add_argument("--status", action="store_true", help="show each run's state and Slurm job, do nothing else")
    p.add_argument("--cancel", action="store_true", help="cancel the grid's queued and running Slurm jobs")
    p.add_argument("--archive", action="store_true",
                   help="train and evaluate nothing: copy the finished, evaluated runs into the grid's archive "
                        "(its archive: key), e.g. while the grid trains in another process")
    p.add_argument("--report", action="store_true",
                   help="train nothing here: write the grid's reports from the runs that are finished (records "
                        "from its archive included); for a grid on Slurm, once its jobs have ended (with "
                        "--launcher slurm: after submitting)")
    p.add_argument("--until", type=deadline_arg, default=None, metavar="TIME",
                   help="stop taking runs at this time: 09:25 (the next such time), 2026-12-03T09:25, or a "
                        "duration such as 3h30m; a run starts only if its estimate ends by then, training still "
                        "under way then is stopped at a checkpoint, and the same command continues later")
    p.add_argument("--rows", nargs="+", default=None, metavar="PATTERN",
                   help="train and evaluate only these rows (run names without seed-N, or whole run names; shell "
                        "patterns such as 'fire-*'); the reports still include every finished run")
    usage_when_empty(p, argv)
    negative = negative_until(list(sys.argv[1:] if argv is None else argv))
    if negative:
        raise UserError(negative)
    return p.parse_args(argv)


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.until is not None and args.launcher == "slurm":
        raise UserError("--until stops runs trained here; on Slurm each job ends at its time limit "
                        "(--slurm time=HH:MM:SS), and --launcher slurm submits again what did not finish")
    if args.launcher == "slurm" and not (args.status or args.cancel):
        check_slurm()  # before anything is planned
    for device in args.devices or ():  # before any run starts, not in each run's log
        resolve_device(device, "--devices")
    # A SIGTERM (kill, a session or an allocation ending) is passed on to the runs training here,
    # which save a checkpoint and stop, instead of leaving them to train on as orphans.
    try:
        with sigterm_stops_jobs() if args.launcher == "local" else contextlib.nullcontext():
            code = run_grid(args)
    except KeyboardInterrupt:
        logger.warning("\ninterrupted: finished runs are kept and the current one saved a checkpoint; "
                       "run the same command again to continue")
        return 128 + signal.SIGINT
    if args.launcher == "local" and stopped():
        logger.warning(f"\nstopped by SIGTERM: finished runs are kept and those training saved a checkpoint; "
                       f"run the same command again to continue (ropelab ablate {args.grid})")
        return 128 + signal.SIGTERM
    return code


if __name__ == "__main__":
    moved("python scripts/ablate.py", "ropelab ablate")
    sys.exit(main())
