"""Exact-match accuracy on synthetic tasks: ``python -m eval.tasks RUN_DIR... [options]``.

For every run, task, RoPE scaling (RoPE runs only; factor = length / L_train unless
``eval.factor`` fixes it) and length: the fraction of ``eval.tasks.samples`` test instances
whose answer tokens are all predicted exactly (eval/exact_match.py), with a 95% Wilson
interval (eval/stats.py); for passkey per (length, depth) cell, plus k_max
(eval/kmax.py). Writes ``results.json``, ``report.md`` and PNG plots into ``--out``
(eval/task_report.py).

Which tasks: ``eval.tasks.tasks``, else the run's own tasks (``data.source: synthetic``), else
passkey (runs trained on text, in the paper's wording tokenized with the run's own
tokenizer.json). The settings are each run's own ``eval`` config (configs/schema.py:
EvalConfig and its ``tasks`` section); the flags override its keys, as in
``python -m eval.extrapolation``. Every (run, task, length) is checked before anything is
evaluated, so impossible settings stop the command with a message and nothing written.
Lengths a learned table cannot serve are "n/a" cells; asking only for such lengths is an
error. Results are cached per run and checkpoint (RunDir.eval_cache).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from configs import override_section
from configs.schema import EvalConfig, RunConfig
from configs.tasks import TASK_NAMES
from common.atomic import write_text_atomic
from data.tasks import Task, TaskError, build_task, check_readable, check_task_name, eval_instance, task_tokenizer
from data.tokenizers import load_tokenizer
from eval.exact_match import exact_match
from eval.extrapolation import model_for, read_eval_file, run_metadata
from eval.kmax import k_max
from eval.report import check_report_dir
from eval.stats import wilson_interval
from eval.task_report import write_task_report
from model.config import SCALING_TYPES
from common.errors import LengthError, UserError
from common.cli import (device_name, entry_point, non_negative_float, non_negative_int, positive_int, probability,
                          scale_factor)
from training.runtime import resolve_device
from training.run_dir import RunDir
from training.saved_run import load_run, read_run_config

EvalFor = Callable[[RunConfig], EvalConfig]


def own_eval(cfg: RunConfig) -> EvalConfig:
    return cfg.eval


def is_synthetic(cfg: RunConfig) -> bool:
    return cfg.data.source == "synthetic"


def wants_tasks(cfg: RunConfig, ev: EvalConfig) -> bool:
    """Whether a grid scores this run on tasks: synthetic runs always, text runs when asked."""
    return is_synthetic(cfg) or bool(ev.tasks.tasks)


def resolved_tasks(cfg: RunConfig, ev: EvalConfig) -> list[str]:
    if ev.tasks.tasks:
        return list(ev.tasks.tasks)
    return list(cfg.data.synthetic.tasks) if is_synthetic(cfg) else ["passkey"]


def run_tasks(cfg: RunConfig, tokenizer, ev: EvalConfig) -> list[Task]:
    """The tasks to score a run on, each checked against every evaluated length."""
    tasks = [build_task(name, cfg.data.synthetic, tokenizer, text=not is_synthetic(cfg))
             for name in resolved_tasks(cfg, ev)]
    for task in tasks:
        for length in ev.resolved_lengths(cfg.train.seq_len):
            task.check_length(length, "the evaluated length")
    return tasks


def check_planned(cfg: RunConfig, ev: EvalConfig, where: str) -> None:
    """Before a run trains: raise TaskError if one of its tasks cannot fill train.seq_len or
    an evaluated length, or a text run would be asked for a task it cannot read."""
    if not wants_tasks(cfg, ev):
        return
    try:
        if is_synthetic(cfg):
            tokenizer = task_tokenizer()
            for name in cfg.data.synthetic.tasks:
                build_task(name, cfg.data.synthetic, tokenizer).check_length(cfg.train.seq_len, "train.seq_len")
            run_tasks(cfg, tokenizer, ev)
        else:  # lengths of the passkey prompt depend on the tokenizer, known after training
            for name in resolved_tasks(cfg, ev):
                check_readable(name, text=True)
    except TaskError as e:
        raise TaskError(f"{where}: {e}") from None


def check_run(run_dir: Path, eval_for: EvalFor) -> None:
    """Raise a UserError now if the run cannot be scored as asked (before any evaluation)."""
    run = RunDir(run_dir)
    cfg = read_run_config(run)
    ev = eval_for(cfg)
    run_tasks(cfg, load_tokenizer(run.tokenizer), ev)
    limit = cfg.model.pos.max_len if cfg.model.pos.kind == "learned" else None
    lengths = ev.resolved_lengths(cfg.train.seq_len)
    if limit is not None and all(n > limit for n in lengths):
        raise LengthError(f"{run}: pos.kind=learned has a table of {limit} positions, and every "
                          f"evaluated length ({', '.join(map(str, lengths))}) is longer; learned positions "
                          f"cannot extrapolate: evaluate lengths up to {limit}")


def score_cell(model, task: Task, length: int, depth: Optional[float], ev: EvalConfig) -> dict:
    """Exact-match counts and the Wilson interval for one (task, length, depth) cell."""
    instances = [eval_instance(task, ev.tasks.seed, length, depth, i) for i in range(ev.tasks.samples)]
    correct = int(exact_match(model, instances).sum())
    low, high = wilson_interval(correct, len(instances))
    return {"correct": correct, "total": len(instances), "accuracy": correct / len(instances),
            "ci_low": low, "ci_high": high}


def evaluate_run(run_dir: Path, ev: EvalConfig, device: str = "cpu", log=print) -> tuple[dict, list[dict], list[dict]]:
    """(metadata, cell rows, k_max rows) for one run."""
    started = time.perf_counter()
    base = load_run(run_dir, device=device)
    tasks = run_tasks(base.cfg, base.tokenizer, ev)
    meta = {**run_metadata(base, ev),
            "trained_on": ("+".join(base.cfg.data.synthetic.tasks) if is_synthetic(base.cfg)
                           else f"text ({base.cfg.data.source})")}
    train_len, limit = base.cfg.train.seq_len, base.model.pos.max_len
    rows, kmax_rows = [], []
    for task in tasks:
        depths = ev.tasks.resolved_depths() if task.name == "passkey" else [None]
        for scaling in ev.resolved_scalings(base.cfg.model.pos.kind):
            cells = []
            for length in ev.resolved_lengths(train_len):
                model = model_for(base, scaling, length, ev)
                for depth in depths:
                    row = {**{k: meta[k] for k in ("run", "name", "encoding", "seed", "train_len")},
                           "task": task.name, "scaling": scaling, "length": length, "depth": depth}
                    if model is None:
                        row.update(status="n/a", note=f"trained table: {limit} positions")
                    else:
                        row.update(status="ok", **score_cell(model, task, length, depth, ev))
                        log(f"  {meta['name']:<28} {task.name:<9} {scaling:<7} L={length:<6}"
                            + (f" depth={depth:<5}" if depth is not None else "")
                            + f" acc={row['accuracy']:.3f} ({row['correct']}/{row['total']})")
                    cells.append(row)
            rows += cells
            if task.name == "passkey":
                kmax_rows.append({"run": meta["run"], "scaling": scaling, "threshold": ev.tasks.kmax_threshold,
                                  "samples": ev.tasks.samples, "kmax": k_max(cells, ev.tasks.kmax_threshold)})
    meta["eval_seconds"] = round(time.perf_counter() - started, 1)
    return meta, rows, kmax_rows


def _cache_key(cfg: RunConfig, ev: EvalConfig) -> str:
    """What changes the numbers: the tasks and their settings, lengths, scalings, factor."""
    key = {"tasks": resolved_tasks(cfg, ev), "settings": dataclasses.asdict(ev.tasks),
           "lengths": ev.resolved_lengths(cfg.train.seq_len), "scalings": ev.resolved_scalings(cfg.model.pos.kind),
           "factor": ev.factor}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def cached_result(run: RunDir, cfg: RunConfig, ev: EvalConfig) -> Optional[dict]:
    """The cached task scores of ``run``'s newest checkpoint under ``ev``, or None."""
    path = run.eval_cache("tasks", _cache_key(cfg, ev))
    ckpt = run.latest_checkpoint()
    if ckpt is None or not path.exists():
        return None
    cached = json.loads(path.read_text())
    return cached if cached.get("checkpoint") == ckpt.name else None


def cached_evaluation(run_dir: Path, eval_for: EvalFor, device: str, log) -> tuple[dict, list[dict], list[dict]]:
    """evaluate_run, reusing an earlier result for the same checkpoint and settings."""
    run = RunDir(run_dir)
    cfg = read_run_config(run)
    ev = eval_for(cfg)
    path = run.eval_cache("tasks", _cache_key(cfg, ev))
    cached = cached_result(run, cfg, ev)
    if cached is not None:
        log(f"  reusing {path}")
        return cached["meta"], cached["rows"], cached["kmax"]
    meta, rows, kmax_rows = evaluate_run(run.path, ev, device, log)
    path.parent.mkdir(exist_ok=True)
    write_text_atomic(path, json.dumps({"checkpoint": meta["checkpoint"], "meta": meta, "rows": rows,
                                        "kmax": kmax_rows}))
    return meta, rows, kmax_rows


def run_task_evaluation(run_dirs: Sequence[Path], out: Path, eval_for: EvalFor = own_eval, device: str = "cpu",
                        log=print, missing: Sequence[dict] = ()) -> dict:
    """Score every run with ``eval_for(its config)`` and write results.json, report.md and plots.

    Impossible settings (a task that does not fit a length, a text run asked for a task
    it cannot read) raise before anything is evaluated; a run that cannot be loaded is
    listed as missing, like a failed run in ``missing``.
    """
    failures, usable = list(missing), []
    for run_dir in run_dirs:
        try:
            check_run(Path(run_dir), eval_for)
            usable.append(Path(run_dir))
        except TaskError as e:  # the settings cannot work: stop before anything is scored
            raise TaskError(f"{run_dir}: {e}") from None
        except UserError as e:  # this run cannot be read or served: report it missing
            failures.append({"run": str(run_dir), "error": str(e)})
    if not usable:
        raise UserError("no run could be scored:\n" + "\n".join(f"- {f['run']}: {f['error']}" for f in failures))
    runs, rows, kmax_rows = [], [], []
    for run_dir in usable:
        log(f"scoring {run_dir}")
        meta, run_rows, run_kmax = cached_evaluation(run_dir, eval_for, device, log)
        runs.append(meta)
        rows += run_rows
        kmax_rows += run_kmax
    results = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": runs, "results": rows,
               "kmax": kmax_rows, "missing": failures}
    write_task_report(results, out)
    return results


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eval.tasks", description=__doc__.split("\n\n")[0],
                                epilog="Flags override the keys of each run's own eval config.")
    p.add_argument("runs", nargs="+", type=Path, help="run directories (runs/NAME)")
    p.add_argument("--tasks", nargs="+", metavar="TASK",
                   help=f"eval.tasks.tasks: {', '.join(TASK_NAMES)} (default: the run's own task, or passkey)")
    p.add_argument("--lengths", type=positive_int, nargs="+", help="eval.lengths: evaluated lengths (positions read)")
    p.add_argument("--scaling", nargs="+", choices=SCALING_TYPES, dest="scalings",
                   help="eval.scalings: RoPE scalings to compare (RoPE runs only)")
    p.add_argument("--factor", type=scale_factor, help="eval.factor: fixed RoPE scaling factor (default: L_eval / L_train)")
    p.add_argument("--samples", type=positive_int, help="eval.tasks.samples: instances per length (per depth for passkey)")
    p.add_argument("--depths", type=non_negative_float, nargs="+", help="eval.tasks.depths: passkey depths in [0, 1]")
    p.add_argument("--kmax-threshold", type=probability, help="eval.tasks.kmax_threshold: accuracy that counts as success")
    p.add_argument("--seed", type=non_negative_int, help="eval.tasks.seed: which test instances")
    p.add_argument("--eval-file", type=Path, help="a YAML mapping of eval keys applied before the flags "
                   "(what scripts/ablate.py plans for a run)")
    p.add_argument("--cache-only", action="store_true",
                   help="score and fill each run's cache, write no report (scripts/ablate.py's jobs)")
    p.add_argument("--device", type=device_name, default="cpu", help="torch device for scoring (auto, cpu, cuda, cuda:N, mps)")
    p.add_argument("--out", type=Path, default=Path("reports/tasks"), help="report directory")
    return p.parse_args(argv)


def eval_overrides(args: argparse.Namespace) -> dict:
    """The flags as a tree of eval keys (only those given)."""
    tree = {key: getattr(args, key) for key in ("lengths", "scalings", "factor") if getattr(args, key) is not None}
    nested = {"tasks": args.tasks, "samples": args.samples, "depths": args.depths,
              "kmax_threshold": args.kmax_threshold, "seed": args.seed}
    nested = {k: v for k, v in nested.items() if v is not None}
    for name in nested.get("tasks", []):
        check_task_name(name)  # suggests the closest name
    return {**tree, "tasks": nested} if nested else tree


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    tree = read_eval_file(args.eval_file) if args.eval_file else {}
    flags = eval_overrides(args)
    tasks = {**(tree.get("tasks") or {}), **flags.pop("tasks", {})}
    tree.update(flags)
    if tasks:
        tree["tasks"] = tasks
    override_section(EvalConfig(), tree, "command line", "eval.")  # a bad value fails before any work

    def eval_for(cfg: RunConfig) -> EvalConfig:
        return override_section(cfg.eval, tree, "command line", "eval.")

    device = str(resolve_device(args.device, "--device"))
    if not args.cache_only:
        check_report_dir(args.out)  # before anything is scored
    with torch.inference_mode():
        if args.cache_only:
            for run in args.runs:
                cached_evaluation(run, eval_for, device, print)
            return 0
        run_task_evaluation(args.runs, args.out, eval_for, device=device)
    print(f"wrote {args.out}/report.md, results.json and plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
