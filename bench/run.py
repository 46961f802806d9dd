"""The engine of ``ropelab bench`` (scripts/bench.py, whose docstring says what is measured):
the rows to measure and the pairs refused, the memory each needs checked before any worker
starts, and each measurement in a fresh process (bench/worker.py, run by its path so that
``--compare`` runs this very file against the other tree's code: bench/trees.py), or as
``--rounds`` A/B pairs with the median paired ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import torch

from ropelab import configs
from ropelab.bench.report import headline
from ropelab.bench.trees import THIS, Tree
from ropelab.bench.worker import EVAL_WINDOWS, PLAN_PREFIX, PROMPT, bench_config, run_section, variant_name
from ropelab.common.devices import machine_busy
from ropelab.common.errors import ConfigError, UserError
from ropelab.common.logs import get_logger
from ropelab.configs import load_config
from ropelab.eval.reporting.intervals import median_interval
from ropelab.training.memory import check_fits, check_training, decoding_estimate, forward_estimate
from ropelab.training.provenance import git_commit
from ropelab.training.runtime import GPU_PEAK_SIZES, measure_matmul_peak, resolve_device
from ropelab.training.validation import windows_per_batch

logger = get_logger(__name__)

SECTIONS = ["train", "compile", "decode", "eval"]
SHAPES = {"bench": "bench.yaml", "small": "bench-small.yaml"}
WORKER = Path(__file__).resolve().with_name("worker.py")  # run by its path, in a fresh process


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.exists():
        cpu = next((line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                    if line.startswith("model name")), cpu)
    mem = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "ram_gb": mem, "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "git_commit": git_commit(),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def spec_for(args: argparse.Namespace, config: Path) -> dict:
    """What a worker needs to rebuild the measurement (JSON-safe)."""
    keys = ("set", "repeats", "warmup", "decode_lengths", "decode_repeats", "eval_multipliers", "eval_tokens",
            "eval_repeats", "profile")
    return {"config": str(config), **{k: getattr(args, k) for k in keys}}


def measure(spec: dict, section: str, row: str, tree: Optional[Tree], in_process: bool) -> dict:
    """One measurement: in this process, or in a fresh one against ``tree``'s code (None: the
    code this process imports)."""
    if in_process:
        try:
            return run_section(SimpleNamespace(**spec), section, row)
        except (UserError, RuntimeError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
    env, cwd = (dict(os.environ), Path.cwd()) if tree is None else (tree.env(), tree.root)
    proc = subprocess.run([sys.executable, str(WORKER), json.dumps(spec), section, row],
                          capture_output=True, text=True, env=env, cwd=cwd)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def plan_presets() -> list[str]:
    """The presets of configs/pe/ that give a layer plan (``model.layers``): ``--plans``' choices."""
    import yaml
    names = []
    for path in sorted((Path(configs.__file__).parent / "pe").glob("*.yaml")):
        tree = yaml.safe_load(path.read_text()) or {}
        if "layers" in (tree.get("model") or {}):
            names.append(path.stem)
    return names


def plan_variants(args: argparse.Namespace, spec: dict) -> tuple[list[str], dict[str, str]]:
    """The rows to measure, and the pairs the model refuses with its reason (skipped).

    A bad config (unknown key, wrong type) fails here, before any measurement; a pair that
    only this encoding and attention kind make impossible is skipped and reported.
    """
    load_config(spec["config"], args.set)
    names = [variant_name(a, k) for a in args.attention for k in args.kinds] if args.attention else list(args.kinds)
    names += [PLAN_PREFIX + plan for plan in getattr(args, "plans", [])]
    variants, skipped = [], {}
    for name in names:
        try:
            bench_config(SimpleNamespace(**spec), name)
            variants.append(name)
        except ConfigError as e:
            skipped[name] = str(e)
            logger.info(f"skipping {name}: {e}")
    if not variants:
        raise ConfigError("no encoding and attention kind asked for can be measured (each was refused above)")
    return variants, skipped


def check_memory(args: argparse.Namespace, spec: dict, variants: list[str]) -> None:
    """Refuse, before any worker starts, a measurement that cannot fit in memory
    (training/memory.py): a training step of the shape, the longest evaluation
    (``--eval-multipliers``) and the longest generation (``--decode-lengths``)."""
    for row in variants:
        cfg = bench_config(SimpleNamespace(**spec), row)
        device = resolve_device(cfg.train.device)
        if {"train", "compile"} & set(args.sections):
            check_training(cfg, device)
        if "eval" in args.sections:
            length = cfg.train.seq_len * max(args.eval_multipliers)
            batch = windows_per_batch(length, EVAL_WINDOWS)
            check_fits(forward_estimate(cfg.model, batch, length, f"the benchmark's {row} evaluation at "
                                        f"{length:,} tokens ({batch} window{'s' if batch > 1 else ''} per forward)"),
                       device, "Give smaller --eval-multipliers.")
        if "decode" in args.sections:
            total = PROMPT + max(args.decode_lengths)
            check_fits(decoding_estimate(cfg.model, 1, PROMPT, total,
                                         f"the benchmark's {row} generation of {total:,} tokens"),
                       device, "Give shorter --decode-lengths.")


def compare(spec: dict, section: str, row: str, base: Tree, rounds: int) -> dict:
    """``rounds`` A/B pairs of one measurement, in fresh processes, the side that goes first
    alternating (drift in the machine's speed then falls on both sides alike).

    ``base`` and ``this`` are each side's median measurement (its full record, profile
    included); ``rounds`` the headline figures (bench_report.headline) of every pair;
    ``ratio`` the median of the paired ratios this / base with its 95% interval.
    """
    runs: dict[str, list[dict]] = {"base": [], "this": []}
    for r in range(rounds):
        for side in (("base", "this") if r % 2 == 0 else ("this", "base")):
            runs[side].append(measure(spec, section, row, base if side == "base" else THIS, False))
    pairs = [{side: headline(runs[side][r], section) for side in runs} for r in range(rounds)]
    ratios = [p["this"] / p["base"] for p in pairs if p["this"] and p["base"]]
    interval = median_interval(ratios)
    return {**{side: median_record(records, section) for side, records in runs.items()},
            "rounds": pairs,
            "ratio": {"median": statistics.median(ratios) if ratios else None, "pairs": len(ratios),
                      "low": interval and interval[0], "high": interval and interval[1]}}


def median_record(records: list[dict], section: str) -> dict:
    """The record whose headline figure is the median (the lower middle of an even count);
    the first error when every record is one."""
    ok = sorted((r for r in records if headline(r, section) is not None), key=lambda r: headline(r, section))
    return ok[(len(ok) - 1) // 2] if ok else records[0]


def shapes_of(args: argparse.Namespace) -> dict[str, Path]:
    if args.config is not None:
        return {"config": args.config}
    return {name: Path(configs.__file__).parent / SHAPES[name] for name in args.shapes}


def run_peak(spec: dict) -> dict:
    """The matmul peak every row's MFU is against, measured once at the start of this run (a
    peak measured beside each row would move with the load at that moment, and the rows'
    MFU with it), and whether other work shared the CPUs then."""
    cfg = load_config(spec["config"], spec["set"])
    device = resolve_device(cfg.train.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    # A GPU reaches its matmul limit only on large matrices (training/runtime.py: GPU_PEAK_SIZES).
    sizes = GPU_PEAK_SIZES if device.type == "cuda" else (512, 1024, 2048)
    peak = measure_matmul_peak(device, dtype, sizes=sizes, repeats=10)
    return {**peak, "when": "at the start of this run", "busy": machine_busy(device.type)}


def warn_if_busy(busy: str) -> None:
    if busy:
        logger.warning(f"warning: other work shares the CPUs ({busy}): every timing runs slow and noisy, and rows "
                       "measured at different moments are not comparable; compare ratios from one run, on a quiet "
                       "machine (each row says whether it was measured while busy)")


def run_shapes(args: argparse.Namespace, base: Optional[Tree]) -> dict:
    shapes = {}
    for name, config in shapes_of(args).items():
        spec = spec_for(args, config)
        variants, skipped = plan_variants(args, spec)
        check_memory(args, spec, variants)
        warn_if_busy(machine_busy())
        if {"train", "compile"} & set(args.sections):
            spec["peak"] = run_peak(spec)
            logger.info(f"{name}: matmul peak {spec['peak']['flops'] / 1e9:,.0f} GFLOP/s ({spec['peak']['dtype']}, "
                        f"best of 10 at {spec['peak']['size']}²), the MFU of every row below is against it")
        shape = {"config": str(config), "overrides": args.set, "kinds": variants, "skipped": skipped,
                 "learned_table": "sized to the longest sequence measured", "peak": spec.get("peak")}
        todo, done = len(args.sections) * len(variants), 0
        for section in args.sections:
            shape[section] = {}
            for row in variants:
                busy, started = machine_busy(), time.perf_counter()
                logger.info(f"{name:<6} {section:<8} {row} ({done + 1} of {todo}) …" + (f" [busy: {busy}]" if busy else ""))
                if base is None:
                    shape[section][row] = {**measure(spec, section, row, None, args.in_process), "busy": busy}
                else:
                    shape[section][row] = {**compare(spec, section, row, base, args.rounds), "busy": busy}
                done += 1
                logger.info(f"{name:<6} {section:<8} {row} done in {time.perf_counter() - started:.0f} s")
        shapes[name] = shape
    return shapes
