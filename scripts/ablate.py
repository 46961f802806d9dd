"""Grid → train → evaluate → report: ``python scripts/ablate.py configs/ablations/NAME.yaml``.

Re-running the same command is always safe: finished runs are skipped, interrupted ones
resume from their last checkpoint, and nothing complete is trained again (evaluations
are cached per run and checkpoint too). Each run trains in its own process, so one
failure does not stop the others; the summary lists what failed and why, and the report
states which runs are missing. Each run's output goes to ``train.log`` in its run
directory. With ``--devices cuda:0 cuda:1 …`` runs are spread one per device; on CPU they
run one after another, or with ``--devices cpu cpu`` two at a time, each with half the
cores (tiny models use one core better than two: a step is too small to split well, and
two processes' threads competing for the same cores slow both down many times over). A run on disk counts as the grid's when it is the same experiment
(configs/experiment.py), so raising the grid's ``train.max_steps`` continues finished runs.

What is evaluated follows what the runs were trained on: runs trained on text get the
perplexity sweep (eval/extrapolation.py, report in the grid's report directory); runs
trained on synthetic tasks, and text runs whose ``eval.tasks.tasks`` names tasks (passkey),
get task accuracy (eval/tasks.py, report in its ``tasks/`` subdirectory). Task settings
that cannot work (a task longer than a length) stop the grid before anything trains.
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

from tqdm import tqdm

from configs import load_config
from configs.experiment import experiment_differences
from configs.grid import Grid, PlannedRun, load_grid
from configs.schema import EvalConfig, RunConfig
from eval.extrapolation import run_extrapolation
from eval.tasks import check_planned, run_task_evaluation, wants_tasks
from model.errors import UserError
from training.checkpoint import read_meta
from training.cli import entry_point
from training.run_dir import RunDir


def status(run: PlannedRun) -> tuple[str, str]:
    """(state, detail): new | partial | done | conflict, as ``train.py --resume`` would see it."""
    run_dir = RunDir(run.run_dir)
    try:
        ckpt = run_dir.latest_checkpoint() if run_dir.path.exists() else None
    except UserError as e:
        return "conflict", str(e)
    if ckpt is None:
        return "new", ""
    diffs = experiment_differences(load_config(run_dir.config), run.cfg)
    if diffs:
        return "conflict", (f"{run_dir} holds a run with other settings ({', '.join(diffs)}); "
                            "move it away or give the grid another name")
    step, total = read_meta(ckpt)["step"], run.cfg.train.total_steps()
    if step >= total:
        return "done", f"step {step}"
    return "partial", f"step {step}/{total}"


def train_one(grid: Grid, run: PlannedRun, device: Optional[str], threads: Optional[int] = None) -> tuple[bool, str]:
    """Train (or resume) one run in a subprocess, its output in the run's log; (ok, reason).

    ``threads``: CPU threads for a run that shares the CPU with other workers.
    """
    log_path = RunDir(run.run_dir).log
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "train", str(grid.base), *run.overrides,
           "train.resume=auto", "log.progress=false"]
    env = dict(os.environ)
    if device and device.startswith("cuda:"):
        env["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
    if device == "cpu":
        cmd.append("train.device=cpu")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
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
    cpu_workers = sum(d == "cpu" for d in devices)
    cpu_threads = max(1, (os.cpu_count() or 1) // cpu_workers) if cpu_workers > 1 else None

    def worker(device: Optional[str]) -> None:
        while True:
            try:
                run = jobs.get_nowait()
            except queue.Empty:
                return
            with lock:
                bar.write(f"→ {run.name}" + (f" on {device}" if device else ""))
            ok, reason = train_one(grid, run, device, cpu_threads if device == "cpu" else None)
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


def planned_eval(runs: list[PlannedRun]):
    """The evaluation config of each planned run (its config + the grid's eval), by run name."""
    by_name = {run.cfg.name: run.cfg.eval for run in runs}

    def eval_for(cfg: RunConfig) -> EvalConfig:
        return by_name[cfg.name]
    return eval_for


def evaluate(grid: Grid, runs: list[PlannedRun], finished: list[PlannedRun], failures: dict[str, str],
             device: str) -> None:
    """Perplexity for runs trained on text, task accuracy for those that want it (see module doc)."""
    eval_for = planned_eval(runs)
    for kind, wanted, evaluate_runs, out in (
            ("perplexity", lambda r: r.cfg.data.source != "synthetic", run_extrapolation, grid.report_dir),
            ("tasks", lambda r: wants_tasks(r.cfg, r.cfg.eval), run_task_evaluation, grid.report_dir / "tasks")):
        chosen = [r for r in finished if wanted(r)]
        if not chosen:
            continue
        missing = [{"run": str(r.run_dir), "error": failures[r.name]} for r in runs if r.name in failures and wanted(r)]
        results = evaluate_runs([r.run_dir for r in chosen], out, eval_for, device=device, missing=missing)
        print(f"{kind} report: {out / 'report.md'} ({len(results['runs'])} runs)")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("grid", type=Path, help="a grid file, e.g. configs/ablations/pe-extrapolation-cpu.yaml")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their state, do nothing")
    p.add_argument("--devices", nargs="+", default=None,
                   help="train runs in parallel, one per device (e.g. cuda:0 cuda:1, or cpu cpu: two at a "
                        "time sharing the cores); default: one at a time")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides for every run (part of the runs' identity)")
    p.add_argument("--skip-eval", action="store_true", help="train only")
    return p.parse_args(argv)


def run_grid(args: argparse.Namespace) -> int:
    grid = load_grid(args.grid)
    runs = grid.plan(args.set)
    for run in runs:
        check_planned(run.cfg, run.cfg.eval, f"{grid.source}: run {run.name}")
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
        evaluate(grid, runs, finished, failures, args.devices[0] if args.devices else "cpu")
    print(f"\n{len(finished)}/{len(runs)} runs finished.")
    for name, reason in failures.items():
        print(f"  failed: {name}: {reason}")
    return 1 if failures else 0


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run_grid(args)
    except KeyboardInterrupt:
        print("\ninterrupted: finished runs are kept and the current one saved a checkpoint; "
              "run the same command again to continue", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
