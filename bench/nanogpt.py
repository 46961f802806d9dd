"""The engine of ``ropelab bench-nanogpt`` (scripts/bench_nanogpt.py, whose docstring says what
is measured and why so): nanoGPT's README CPU recipe and ours as whole runs in their own
processes, what each run's log or checkpoint says of its loop, the paired ratios over rounds,
and both models' training steps in turn in one process (``--paired``) with their profiles.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import torch

from ropelab.bench.worker import CHAR_VOCAB, bench_config, step_data, top_ops
from ropelab.common.errors import UserError
from ropelab.configs import load_config
from ropelab.eval.reporting.intervals import median_interval
from ropelab.training.runtime import setup_runtime, time_calls
from ropelab.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "recipes" / "nanogpt-shakespeare-char-cpu.yaml"
BATCH, BLOCK = 12, 64  # the recipe's shape, on both sides
ITER_LINE = re.compile(r"^iter (\d+): loss ([0-9.]+), time ([0-9.]+)ms")
EVAL_LINE = re.compile(r"^step (\d+): train loss ([0-9.]+), val loss ([0-9.]+)")
SIDES = ("nanogpt", "eager", "compiled")


def nanogpt_command(steps: int, out_dir: Path) -> list[str]:
    """nanoGPT's README CPU recipe, verbatim apart from the step count and where it saves."""
    return [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
            "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4",
            "--n_head=4", "--n_embd=128", f"--max_iters={steps}", f"--lr_decay_iters={steps}", "--dropout=0.0",
            f"--out_dir={out_dir}"]


def ours_command(steps: int, out_dir: Path, compiled: bool) -> list[str]:
    return [sys.executable, "train.py", str(RECIPE), f"train.max_steps={steps}", "train.eval_batches=40",
            f"train.compile={'true' if compiled else 'false'}", f"out_dir={out_dir}", "name=bench",
            "log.progress=false"]


def parse_nanogpt(log: str) -> dict:
    """Loop seconds, tokens and the last validation loss from nanoGPT's stdout."""
    times = [float(m.group(3)) / 1000 for m in map(ITER_LINE.match, log.splitlines()) if m]
    evals = [float(m.group(3)) for m in map(EVAL_LINE.match, log.splitlines()) if m]
    if not times:
        raise UserError("nanoGPT printed no 'iter N: … time X ms' lines; is --nanogpt a nanoGPT checkout?\n"
                        + "\n".join(log.splitlines()[-5:]))
    return {"seconds": sum(times), "tokens": len(times) * BATCH * BLOCK, "val_loss": evals[-1] if evals else None}


def parse_ours(run_dir: Path) -> dict:
    """Loop seconds, tokens and validation loss from our run's final checkpoint."""
    metas = sorted(run_dir.glob("checkpoints/step_*/meta.json"))
    if not metas:
        raise UserError(f"{run_dir} has no checkpoint; the run failed (see its train.log)")
    meta = json.loads(metas[-1].read_text())
    return {"seconds": meta["train_seconds"], "tokens": meta["tokens"], "val_loss": meta.get("val_loss")}


def run_side(side: str, steps: int, nanogpt: Path, threads: int, scratch: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{side}-", dir=scratch))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    cmd, cwd = ((nanogpt_command(steps, out), nanogpt) if side == "nanogpt"
                else (ours_command(steps, out, side == "compiled"), ROOT))
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise UserError(f"the {side} run failed (exit {proc.returncode}):\n{tail}")
    found = parse_nanogpt(proc.stdout) if side == "nanogpt" else parse_ours(out / "bench")
    return {**found, "process_seconds": wall, "tokens_per_sec": found["tokens"] / found["seconds"]}


def summarize(rounds: list[dict[str, dict]]) -> dict:
    out = {}
    for side in ("eager", "compiled"):
        ratios = [r[side]["tokens_per_sec"] / r["nanogpt"]["tokens_per_sec"] for r in rounds if side in r]
        if ratios:
            out[f"{side} / nanogpt"] = {"median": statistics.median(ratios), "interval": median_interval(ratios),
                                        "ratios": ratios}
    return out


def nanogpt_step(nanogpt: Path) -> Callable[[], None]:
    """One training step of nanoGPT's own model at the recipe's shape: forward with its loss,
    backward, clipping at 1.0, its AdamW (``configure_optimizers``), as its train.py does."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", nanogpt / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    conf = module.GPTConfig(block_size=BLOCK, vocab_size=CHAR_VOCAB, n_layer=4, n_head=4, n_embd=128, dropout=0.0,
                            bias=False)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its size and parameter groups
        model = module.GPT(conf)
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    batch = torch.randint(0, CHAR_VOCAB, (BATCH, BLOCK + 1), generator=torch.Generator().manual_seed(0))
    x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()  # as its get_batch stacks them

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


SMALL = ROOT / "configs" / "bench-small.yaml"  # the recipe's shape, as scripts/bench.py measures it


def default_kind() -> str:
    """The encoding of the small shape's own config."""
    return load_config(SMALL).model.pos.kind


def our_step(kind: str) -> Callable[[], None]:
    """One training step of ours at the same recipe (configs/bench-small.yaml) with encoding ``kind``."""
    spec = SimpleNamespace(config=str(SMALL), set=[], eval_multipliers=[1], decode_lengths=[1])
    cfg = bench_config(spec, kind)
    return Trainer(cfg, setup_runtime(cfg.train), data=step_data(cfg)).train_step


def paired_steps(nanogpt: Path, steps: int, warmup: int = 5, profile_ops: int = 12,
                 kinds: Optional[tuple[str, ...]] = None) -> dict:
    """nanoGPT's step and ours (one per encoding of ``kinds``) in turn in this process: median
    times, the paired ratios ours / nanoGPT in tokens/s, profiles."""
    kinds = kinds or (default_kind(),)
    sides = {"nanogpt": nanogpt_step(nanogpt), **{kind: our_step(kind) for kind in kinds}}
    for step in sides.values():
        time_calls(step, 0, warmup, torch.device("cpu"))
    times: dict[str, list[float]] = {side: [] for side in sides}
    for k in range(steps):
        for side in (list(sides) if k % 2 == 0 else list(sides)[::-1]):
            times[side] += time_calls(sides[side], 1, 0, torch.device("cpu"))
    ours = {}
    for kind in kinds:
        ratios = [n / e for n, e in zip(times["nanogpt"], times[kind])]  # > 1: ours is faster
        interval = median_interval(ratios)
        ours[kind] = {"step_ms": statistics.median(times[kind]) * 1e3, "speed_ratio": statistics.median(ratios),
                      "interval": list(interval) if interval else None}
    return {"steps": steps, "nanogpt_step_ms": statistics.median(times["nanogpt"]) * 1e3, "ours": ours,
            "profiles": {side: top_ops(step, profile_ops, steps=5) for side, step in sides.items()}}


def print_paired(found: dict) -> None:
    print(f"one training step of each, {found['steps']} in turn in one process: nanoGPT "
          f"{found['nanogpt_step_ms']:.1f} ms")
    for kind, row in found["ours"].items():
        interval = row["interval"]
        spread = f" (95% interval {interval[0]:.3f}–{interval[1]:.3f})" if interval else ""
        print(f"  ours, {kind}: {row['step_ms']:.1f} ms; ours / nanoGPT tokens/s ×{row['speed_ratio']:.3f}{spread}")
    for side, ops in found["profiles"].items():
        print(f"\nwhere one {side} step spends its time (self CPU, torch.profiler):")
        for op in ops:
            print(f"  {op['share']:6.1%} {op['self_cpu_ms_per_step']:8.2f} ms {op['calls_per_step']:6.0f}×  {op['op']}")
