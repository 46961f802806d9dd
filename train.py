"""Train a model: ``python train.py CONFIG [key=value ...] [--resume] [--device DEVICE]``.

The command line only: it resolves one RunConfig, sets up the runtime (device, precision,
the torchrun group), takes the run's lock and hands over to training/trainer.py, which
writes the run directory (see training/run_dir.py for its layout). Under ``torchrun`` the
same command trains data-parallel.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Optional

from ropelab.common.cli import device_name, entry_point, usage_when_empty
from ropelab.common.devices import DEVICE_NAMES
from ropelab.common.errors import UserError
from ropelab.common.storage import make_dir
from ropelab.common.logs import get_logger
from ropelab.configs import config_to_yaml, load_config
from ropelab.configs.loader import overlay_alone
from ropelab.configs.schema import RunConfig
from ropelab.training.run_dir import RunDir, runs_in
from ropelab.training.run_lock import RunLock
from ropelab.training.runtime import Runtime, setup_runtime
from ropelab.training.trainer import Trainer

logger = get_logger(__name__)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="examples:\n"
                                            "  python train.py configs/quickstart.yaml\n"
                                            "  python train.py configs/quickstart.yaml model.pos.kind=alibi "
                                            "train.max_steps=200 name=alibi\n"
                                            "  python train.py configs/quickstart.yaml --device cuda:1\n"
                                            "  python train.py configs/quickstart.yaml --resume   "
                                            "# continue an interrupted run")
    parser.add_argument("config", help="a YAML file under configs/ (or your own)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. train.lr=3e-4")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run (out_dir/name) from its newest intact checkpoint; "
                             "refused when there is no such run")
    parser.add_argument("--device", type=device_name,
                        help=f"torch device, short for train.device=DEVICE: {DEVICE_NAMES}")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (YAML, overrides applied) and exit without training")
    usage_when_empty(parser, argv)
    return parser.parse_intermixed_args(argv)  # overrides may follow --resume


def check_resume_target(cfg: RunConfig) -> None:
    """``--resume`` must name a run that has something to continue."""
    run = RunDir.of(cfg)
    if run.latest_checkpoint() is not None:
        return
    runs = runs_in(cfg.out_dir)
    there = (f"runs in {cfg.out_dir}: {', '.join(runs)}" if runs else f"{cfg.out_dir} holds no runs")
    what = "has no checkpoint yet" if run.path.exists() else "does not exist"
    raise UserError(f"--resume: {run} {what}, so there is nothing to continue ({there}). Give the name of "
                    "one of them (name=...), or drop --resume to start this run from step 0.")


def warn_about(cfg: RunConfig, rt: Runtime) -> None:
    """Settings that are legal but almost certainly not what was meant."""
    t = cfg.train
    total = t.total_steps(rt.world_size)
    if t.warmup_steps >= total and rt.is_main:  # the same on every rank: said once
        logger.warning(f"warning: train.warmup_steps={t.warmup_steps} is not below the run's {total} steps, so the "
                       "learning rate never reaches train.lr; lower train.warmup_steps")


@entry_point
def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    device = [f"train.device={args.device}"] if args.device else []
    overlay = overlay_alone(args.config)
    if overlay:
        raise UserError(overlay)
    cfg = load_config(args.config, [*args.overrides, *device])
    if args.print_config:
        print(config_to_yaml(cfg), end="")
        return 0
    if args.resume:
        check_resume_target(cfg)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, resume="auto"))
    rt = setup_runtime(cfg.train)
    try:
        warn_about(cfg, rt)
        run = RunDir.of(cfg)
        if rt.is_main:
            make_dir(cfg.out_dir, "out_dir")
        # One process trains into a run directory at a time (ranks of one torchrun job share it).
        with RunLock(run) if rt.is_main else contextlib.nullcontext():
            if rt.is_main:
                run.remove_leftovers()  # of writes that a crash interrupted
            return Trainer(cfg, rt).run()
    finally:
        rt.close()


if __name__ == "__main__":
    sys.exit(main())
