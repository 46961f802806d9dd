"""Grid → train → evaluate → report: ``python scripts/ablate.py configs/ablations/NAME.yaml``.

Re-running the same command is always safe: finished runs are skipped, interrupted ones
resume from their last checkpoint, and nothing complete is trained again (evaluations
are cached per run and checkpoint too). Each run trains in its own process, so one
failure does not stop the others; the summary lists what failed and why, and the report
states which runs are missing. With ``--devices cuda:0 cuda:1 …`` runs are spread one per
device; on CPU they run one after another.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tqdm import tqdm  # noqa: E402

from configs import config_to_dict, load_config  # noqa: E402
from configs.grid import Grid, PlannedRun, load_grid  # noqa: E402
from eval.extrapolation import Settings, run_extrapolation  # noqa: E402
from model.checkpoint import latest_checkpoint, read_meta  # noqa: E402
from model.errors import UserError  # noqa: E402

# Config sections that may legitimately differ between the plan and a run on disk.
IGNORED = {("model", "vocab_size"), ("train", "resume"), ("train", "device")}


def status(run: PlannedRun) -> tuple[str, str]:
    """(state, detail): new | partial | done | conflict."""
    run_dir = run.run_dir
    try:
        ckpt = latest_checkpoint(run_dir) if run_dir.exists() else None
    except UserError as e:
        return "conflict", str(e)
    if ckpt is None:
        return "new", ""
    saved = load_config(run_dir / "config.yaml")
    old, new = config_to_dict(saved), config_to_dict(run.cfg)
    diffs = [f"{s}.{k}" for s in ("model", "data", "train") for k in set(old[s]) | set(new[s])
             if (s, k) not in IGNORED and old[s].get(k) != new[s].get(k)]
    if diffs:
        return "conflict", (f"{run_dir} holds a run with other settings ({', '.join(sorted(diffs))}); "
                            "move it away or give the grid another name")
    meta = read_meta(ckpt)
    if meta.get("finished"):
        return "done", f"step {meta['step']}"
    return "partial", f"step {meta['step']}/{meta.get('total_steps', '?')}"


def train_one(grid: Grid, run: PlannedRun, device: Optional[str], log_dir: Path) -> tuple[bool, str]:
    """Train (or resume) one run in a subprocess; (ok, reason)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{run.name}.log"
    cmd = [sys.executable, str(ROOT / "train.py"), str(grid.base), *run.overrides,
           "train.resume=auto", "log.progress=false"]
    env = dict(os.environ)
    if device and device.startswith("cuda:"):
        env["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=os.getcwd())
    if code == 0:
        return True, ""
    lines = [l for l in log_path.read_text().splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("error:")]
    reason = (errors[-1] if errors else (lines[-1] if lines else "no output"))[:300]
    return False, f"exit {code}: {reason} (log: {log_path})"


def train_all(grid: Grid, todo: list[PlannedRun], devices: list[Optional[str]]) -> dict[str, str]:
    """Train runs, one per device at a time; returns {run name: failure reason}."""
    jobs: queue.Queue = queue.Queue()
    for run in todo:
        jobs.put(run)
    failures: dict[str, str] = {}
    bar = tqdm(total=len(todo), desc=f"{grid.name}: training", unit="run")
    lock = threading.Lock()

    def worker(device: Optional[str]) -> None:
        while True:
            try:
                run = jobs.get_nowait()
            except queue.Empty:
                return
            with lock:
                bar.write(f"→ {run.name}" + (f" on {device}" if device else ""))
            ok, reason = train_one(grid, run, device, Path(grid.out_dir) / grid.name / "logs")
            with lock:
                if not ok:
                    failures[run.name] = reason
                    bar.write(f"✗ {run.name}: {reason}")
                bar.update(1)

    threads = [threading.Thread(target=worker, args=(d,), daemon=True) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bar.close()
    return failures


def settings_for(grid: Grid, device: Optional[str]) -> Settings:
    ev = grid.eval
    return Settings(lengths=ev.get("lengths"), scalings=ev.get("scalings"), protocols=ev.get("protocols"),
                    stride=ev.get("stride"), max_tokens=ev.get("max_tokens"), split=ev.get("split"),
                    factor=ev.get("factor"), batch_size=ev.get("batch_size", 8), device=device or "cpu")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("grid", type=Path, help="a grid file, e.g. configs/ablations/pe-extrapolation-cpu.yaml")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their state, do nothing")
    p.add_argument("--devices", nargs="+", default=None,
                   help="train runs in parallel, one per device (e.g. cuda:0 cuda:1); default: one at a time")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides for every run (part of the runs' identity)")
    p.add_argument("--skip-eval", action="store_true", help="train only")
    return p.parse_args(argv)


def run_grid(args: argparse.Namespace) -> int:
    grid = load_grid(args.grid)
    runs = grid.plan(args.set)
    states = {run.name: status(run) for run in runs}
    base = os.path.relpath(grid.base.resolve())
    print(f"grid {grid.name}: {len(runs)} runs from {base} → {Path(grid.out_dir) / grid.name}")
    for run in runs:
        state, detail = states[run.name]
        print(f"  {run.name:<40} {state:<8} {detail}")
    if args.dry_run:
        print("train one by hand with: python train.py", base, " ".join(runs[0].overrides))
        return 0
    failures = {name: detail for name, (state, detail) in states.items() if state == "conflict"}
    todo = [run for run in runs if states[run.name][0] in ("new", "partial")]
    if todo:
        failures.update(train_all(grid, todo, args.devices or [None]))
    finished = [run for run in runs if run.name not in failures and status(run)[0] == "done"]
    for run in runs:
        if run.name not in failures and run not in finished:
            failures[run.name] = "not finished"
    if not args.skip_eval and finished:
        device = args.devices[0] if args.devices else None
        results = run_extrapolation([r.run_dir for r in finished], settings_for(grid, device), grid.report_dir,
                                    missing=[{"run": str(r.run_dir), "error": failures[r.name]}
                                             for r in runs if r.name in failures])
        print(f"report: {grid.report_dir / 'report.md'} ({len(results['runs'])} runs)")
    print(f"\n{len(finished)}/{len(runs)} runs finished.")
    for name, reason in failures.items():
        print(f"  failed: {name}: {reason}")
    return 1 if failures else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run_grid(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept and the current one saved a checkpoint; "
              "run the same command again to continue", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
