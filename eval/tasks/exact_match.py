"""Exact-match accuracy on synthetic tasks: ``ropelab tasks RUN_DIR... [options]``.

For every run, task, RoPE scaling (RoPE runs only; factor = length / L_train unless
``eval.factor`` fixes it) and length: the fraction of ``eval.tasks.samples`` test instances
whose answer tokens are all predicted exactly (training/exact_match.py), with a 95% Wilson
interval (eval/reporting/stats.py); for passkey and multikey per (length, depth) cell, plus k_max for
passkey (eval/tasks/effective_length.py); for every task, where each instance's first wrong answer token
falls. Writes ``results.json``, ``report.md`` and PNG plots into ``--out``
(eval/tasks/report.py).

Which tasks: ``eval.tasks.tasks``, else the run's own tasks (``data.source: synthetic``), else
those its training mixed in (``data.mix``, in the task wording tokenized with the run's own
tokenizer.json) or, for a fine-tune on text, its parent's (training/warm_start.py:
``learned_wording``), else passkey (runs trained on text alone, in the paper's wording).
The settings are each run's own ``eval`` config (configs/eval_config.py:
EvalConfig and its ``tasks`` section); the flags override its keys, as in
``ropelab eval``. Every (run, task, length) is checked before anything is
evaluated, so impossible settings stop the command with a message and nothing written.
Lengths a learned table cannot serve are "n/a" cells; asking only for such lengths is an
error. The latest checkpoint is scored, or those of the training steps ``eval.steps``
(``--steps``; rows "ROW @ STEP", e.g. passkey accuracy over a fine-tuning budget).

The command line, the ``--eval-file`` merge and the per-run cache (RunDir.eval_cache, per
checkpoint and cache key) are eval/evaluation.py's, shared with ``ropelab eval``;
this module is the scoring of one run, its cache key, its flags and its report.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from ropelab.configs.schema import EvalConfig, RunConfig
from ropelab.configs.loader import parse_override
from ropelab.configs.tasks import REPORT_KEYS, TASK_NAMES, varied
from ropelab.data.tasks import Task, TaskError, build_task, check_readable, check_task_name, eval_instance, task_tokenizer
from ropelab.data.tasks.base import answer_source
from ropelab.eval.core import evaluation
from ropelab.eval.core.evaluation import (EvalFor, Evaluation, check_served, evaluate_all, evaluated_checkpoints, mark_step,
                         own_eval)
from ropelab.training.exact_match import answer_tokens, first_errors, instances_per_batch, wrong_answers
from ropelab.eval.lm.extrapolation import model_for, run_metadata
from ropelab.eval.tasks.effective_length import k_max
from ropelab.eval.reporting.report_dir import TASKS as TASK_REPORT
from ropelab.eval.reporting.stats import wilson_interval
from ropelab.eval.tasks.report import write_task_report
from ropelab.common.errors import ConfigError, UserError
from ropelab.model.encodings import served_length
from ropelab.training.memory import Estimate, forward_estimate, largest
from ropelab.common.cli import entry_point, non_negative_float, non_negative_int, positive_int, probability
from ropelab.common.logs import get_logger
from ropelab.training.checkpoint import read_meta
from ropelab.training.provenance import git_commit
from ropelab.training.warm_start import learned_wording
from ropelab.training.run_dir import RunDir
from ropelab.training.saved_run import SavedRun, checked_tokenizer, load_run, read_run_config

logger = get_logger(__name__)


def is_synthetic(cfg: RunConfig) -> bool:
    return cfg.data.source == "synthetic"


def wants_tasks(cfg: RunConfig, ev: EvalConfig) -> bool:
    """Whether a grid scores this run on tasks: synthetic runs and text runs that mixed tasks
    into training (data.mix) always, other text runs when asked."""
    return is_synthetic(cfg) or bool(ev.tasks.tasks or cfg.data.mix.tasks)


def resolved_tasks(cfg: RunConfig, ev: EvalConfig, parent: Optional[dict] = None) -> list[str]:
    """``parent``: the run's record of its parent (training/warm_start.py), whose mixed tasks it inherits."""
    if ev.tasks.tasks:
        return list(ev.tasks.tasks)
    if is_synthetic(cfg):
        return list(cfg.data.synthetic.tasks)
    return learned_wording(cfg, parent) or ["passkey"]


def in_paper_wording(cfg: RunConfig, name: str, parent: Optional[dict] = None) -> bool:
    """A text run reads a task that neither it nor its parent mixed into training in the paper's
    wording (passkey only)."""
    return not is_synthetic(cfg) and name not in learned_wording(cfg, parent)


def planned_parent(cfg: RunConfig) -> Optional[dict]:
    """Before a fine-tune trains: what its checkpoints will record of its parent's mixed tasks
    (None without a parent, or while the parent is not trained yet)."""
    run = RunDir(Path(cfg.init.run)) if cfg.init.run else None
    ckpt = run.latest_checkpoint() if run is not None and run.is_run() else None
    if ckpt is None:
        return None
    parent_cfg = read_run_config(run)
    return {"mix": learned_wording(parent_cfg, read_meta(ckpt).get("parent"))}


def run_tasks(cfg: RunConfig, tokenizer, ev: EvalConfig, parent: Optional[dict] = None) -> list[Task]:
    """The tasks to score a run on, each checked against every evaluated length."""
    names = resolved_tasks(cfg, ev, parent)
    try:
        synthetic = varied(cfg.data.synthetic.scored_as(ev.tasks.asked, names), ev.tasks.variant)
    except ConfigError as e:
        raise TaskError(str(e)) from None
    tasks = [build_task(name, synthetic, tokenizer, text=in_paper_wording(cfg, name, parent)) for name in names]
    for task in tasks:
        for length in ev.resolved_lengths(cfg.train.seq_len):
            task.check_length(length, "the evaluated length")
    return tasks


def refresh_chance(meta: dict, run: RunDir, cfg: RunConfig, ev: EvalConfig) -> None:
    """A reused evaluation's chance per task, as today's code defines it: chance is a property
    of the task's settings, not a score (one chain of vartrack was once given chance 1, which
    left its effective length undefined)."""
    tasks = run_tasks(cfg, checked_tokenizer(run, cfg), ev, meta.get("parent"))
    meta["chance"] = {task.name: task.chance for task in tasks}


def trained_tasks(cfg: RunConfig, parent: Optional[dict] = None) -> list[str]:
    """The tasks a run (or, fine-tuned on text, its parent) trained on in the wording it is
    scored in: those whose learning the report judges (passkey in the paper's prompt on a
    text run is scored, never trained)."""
    return list(cfg.data.synthetic.tasks) if is_synthetic(cfg) else learned_wording(cfg, parent)


def check_reference(cfg: RunConfig, ev: EvalConfig, parent: Optional[dict] = None) -> None:
    """Raise TaskError where the report could not tell which seeds learned a task they trained
    on: the reference length (eval.tasks.reference_length, else train.seq_len) is not evaluated."""
    lengths = ev.resolved_lengths(cfg.train.seq_len)
    reference = ev.tasks.reference_length or cfg.train.seq_len
    judged = set(resolved_tasks(cfg, ev, parent)) & set(trained_tasks(cfg, parent))
    if ev.tasks.learned_accuracy is not None and judged and reference not in lengths:
        raise TaskError(f"eval.tasks.learned_accuracy={ev.tasks.learned_accuracy:g} judges whether a seed learned a "
                        f"task by its accuracy at the reference length {reference} "
                        f"({'eval.tasks.reference_length' if ev.tasks.reference_length else 'train.seq_len'}), "
                        f"which is not among the evaluated lengths ({', '.join(map(str, lengths))}): evaluate it "
                        "too, or set eval.tasks.learned_accuracy=null to pool every seed")


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
            check_reference(cfg, ev)
        else:  # lengths of the passkey prompt depend on the tokenizer, known after training
            parent = planned_parent(cfg)
            # A fine-tune whose parent is not trained yet cannot start either; it is checked once it can.
            for name in resolved_tasks(cfg, ev, parent) if parent is not None or not cfg.init.run else ():
                check_readable(name, text=in_paper_wording(cfg, name, parent))
            check_reference(cfg, ev, parent)
    except TaskError as e:
        raise TaskError(f"{where}: {e}") from None


def check_run(run_dir: Path, eval_for: EvalFor) -> None:
    """Raise a UserError now if the run cannot be scored as asked (before any evaluation)."""
    run = RunDir(run_dir)
    cfg = read_run_config(run)
    ev = eval_for(cfg)
    ckpt = run.latest_checkpoint()
    parent = read_meta(ckpt).get("parent") if ckpt else None
    run_tasks(cfg, checked_tokenizer(run, cfg), ev, parent)
    check_served(cfg, ev.resolved_lengths(cfg.train.seq_len))
    check_reference(cfg, ev, parent)


def preflight(cfg: RunConfig, ev: EvalConfig) -> Optional[Estimate]:
    """The memory of the largest cell: its instances (int64 tokens and bool answers, twice
    over while they are made) and one forward of a batch of them, whose logits are all held."""
    limit, estimates = served_length(cfg.model.pos), []
    for length in ev.resolved_lengths(cfg.train.seq_len):
        if limit is None or length <= limit:
            instances = ("task instances", 2.0 * ev.tasks.samples * (length + 1) * 9)
            estimates.append(forward_estimate(
                cfg.model, instances_per_batch(length, cfg.model.vocab_size), length,
                f"scoring {cfg.name} at length {length:,} ({ev.tasks.samples} instances per cell)", full_logits=True,
                kept=(instances,)))
    return largest(estimates)


def score_cell(model, task: Task, length: int, depth: Optional[float], ev: EvalConfig) -> dict:
    """Exact-match counts and the Wilson interval for one (task, length, depth) cell, and each
    instance's answer tokens right before its first wrong one (``first_error``, =
    ``answer_tokens`` where all are right, in instance order): where the answer broke
    (eval/tasks/first_error.py) and which instances were right, which paired comparisons of rows
    answering the same instances use (eval/tasks/compare.py). Cells scored before every task
    kept it hold ``outcomes`` ("1" right, "0" wrong) for the tasks whose answer does not grow.
    Where the answer is one of the prompt's candidates (``task.picks``, ``chance`` > 0), ``copied`` says
    per instance whether a wrong answer, greedily decoded, is another span of the prompt and
    how far back it and the right one sit (data/tasks/base.py: ``answer_source``; None where
    right or not a copy; eval/tasks/answers.py), and ``wrote`` the text of the asked span and
    of what was written over it (None where right); cells scored before them have none."""
    instances = [eval_instance(task, ev.tasks.seed, length, depth, i) for i in range(ev.tasks.samples)]
    errors, answers = first_errors(model, instances), answer_tokens(instances)
    correct = int((errors == answers).sum())
    low, high = wilson_interval(correct, len(instances))
    row = {"correct": correct, "total": len(instances), "accuracy": correct / len(instances),
           "ci_low": low, "ci_high": high, "first_error": errors.tolist(), "answer_tokens": answers.tolist()}
    if task.picks and task.chance > 0:  # the answer is one of the prompt's candidates: was a wrong one another?
        written = wrong_answers(model, instances, errors)
        row["copied"] = [None if w is None else answer_source(inst, *w) for inst, w in zip(instances, written)]
        decode = task.tokenizer.decode
        row["wrote"] = [None if w is None else [decode(inst.tokens[w[0]:w[0] + len(w[1])].tolist()), decode(w[1].tolist())]
                        for inst, w in zip(instances, written)]
    return row


def trained_on(cfg: RunConfig) -> str:
    if is_synthetic(cfg):
        return "+".join(cfg.data.synthetic.tasks)
    mix = cfg.data.mix
    return f"text ({cfg.data.source})" + (f" + {mix.fraction:g} {'+'.join(mix.tasks)}" if mix.tasks else "")


def evaluate_run(run_dir: Path, ev: EvalConfig, device: str = "cpu") -> tuple[dict, list[dict], list[dict]]:
    """(metadata, cell rows, k_max rows) for one run: its latest checkpoint, or each of ``ev.steps``."""
    started = time.perf_counter()
    latest = load_run(run_dir, device=device)
    parent = latest.meta.get("parent")
    tasks = run_tasks(latest.cfg, latest.tokenizer, ev, parent)
    meta = {**run_metadata(latest, ev), "trained_on": trained_on(latest.cfg),
            "tasks_trained": trained_tasks(latest.cfg, parent),
            "chance": {task.name: task.chance for task in tasks},
            "eval_commit": git_commit()}  # the code that scores the cells (cached evaluations keep theirs)
    rows, kmax_rows = [], []
    for step, base in evaluated_checkpoints(run_dir, ev, latest, device):
        step_rows, step_kmax = _score_run(base, tasks, ev, meta)
        mark_step(step_rows + step_kmax, step, base)
        rows += step_rows
        kmax_rows += step_kmax
    meta["eval_seconds"] = round(time.perf_counter() - started, 1)
    return meta, rows, kmax_rows


def _score_run(base: SavedRun, tasks: list[Task], ev: EvalConfig, meta: dict) -> tuple[list[dict], list[dict]]:
    """(cell rows, k_max rows) of one checkpoint: every task, scaling, length (and passkey depth)."""
    train_len, limit = base.cfg.train.seq_len, base.model.max_len
    rows, kmax_rows = [], []
    for task in tasks:
        depths = ev.tasks.resolved_depths() if task.has_depth else [None]
        for scaling in ev.resolved_scalings(base.cfg.model.pos.kind):
            cells = []
            for length in ev.resolved_lengths(train_len):
                model = model_for(base, scaling, length, ev)
                for depth in depths:
                    row = {**{k: meta[k] for k in ("run", "name", "encoding", "seed", "train_len", "eval_commit")},
                           "task": task.name, "scaling": scaling, "length": length, "depth": depth}
                    if model is None:
                        row.update(status="n/a", note=f"trained table: {limit} positions")
                    else:
                        row.update(status="ok", **score_cell(model, task, length, depth, ev))
                        logger.info(f"  {meta['name']:<28} {task.name:<9} {scaling:<7} L={length:<6}"
                                    + (f" depth={depth:<5}" if depth is not None else "")
                                    + f" acc={row['accuracy']:.3f} ({row['correct']}/{row['total']})")
                    cells.append(row)
            rows += cells
            if task.name == "passkey":
                kmax_rows.append({"run": meta["run"], "scaling": scaling, "threshold": ev.tasks.kmax_threshold,
                                  "samples": ev.tasks.samples, "kmax": k_max(cells, ev.tasks.kmax_threshold)})
    return rows, kmax_rows


def _cache_key(cfg: RunConfig, ev: EvalConfig) -> str:
    """What changes the numbers: the tasks and their settings (not those of the report alone),
    lengths, scalings, factor, and the checkpoints scored (eval.steps, only when given: keys of
    the latest are as before)."""
    settings = {k: v for k, v in dataclasses.asdict(ev.tasks).items() if k not in REPORT_KEYS}
    if settings["asked"] is None:  # the run's own: keys of evaluations before the key existed stay valid
        del settings["asked"]
    settings["variant"] = ev.tasks.variant.given()
    if not settings["variant"]:  # likewise
        del settings["variant"]
    key = {"tasks": resolved_tasks(cfg, ev), "settings": settings,
           "lengths": ev.resolved_lengths(cfg.train.seq_len), "scalings": ev.resolved_scalings(cfg.model.pos.kind),
           "factor": ev.factor}
    if ev.steps:
        key["steps"] = list(ev.steps)
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def run_task_evaluation(run_dirs: Sequence[Path], out: Path, eval_for: EvalFor = own_eval, device: str = "cpu",
                        missing: Sequence[dict] = ()) -> dict:
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
    done = evaluate_all(TASKS, usable, eval_for, device, failures)
    results = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": done.runs, "results": done.rows,
               "kmax": [row for kmax_rows in done.extras for row in kmax_rows], "missing": done.failures}
    write_task_report(results, out)
    return results


def add_flags(p: argparse.ArgumentParser) -> None:
    """The flags of task scoring (the common ones are eval/evaluation.py's)."""
    p.add_argument("--tasks", nargs="+", metavar="TASK",
                   help=f"eval.tasks.tasks: {', '.join(TASK_NAMES)} (default: the run's own task, or passkey)")
    p.add_argument("--samples", type=positive_int, help="eval.tasks.samples: instances per length (per depth for passkey)")
    p.add_argument("--depths", type=non_negative_float, nargs="+",
                   help="eval.tasks.depths: needle depths in [0, 1] (passkey, multikey)")
    p.add_argument("--kmax-threshold", type=probability, help="eval.tasks.kmax_threshold: accuracy that counts as success")
    p.add_argument("--seed", type=non_negative_int, help="eval.tasks.seed: which test instances")
    p.add_argument("--asked", type=positive_int,
                   help="eval.tasks.asked: multikey needles (vartrack chains) asked per instance (default: as the run trained)")
    p.add_argument("--variant", nargs="+", metavar="KEY=VALUE", type=_variant_setting,
                   help="eval.tasks.variant: score instances with these data.synthetic settings instead of the "
                        "run's own, e.g. --variant chains=1 or distractors=8")


def _variant_setting(text: str) -> tuple[str, object]:
    """``chains=1`` -> ("chains", 1): one data.synthetic key (no dots), its value read as YAML."""
    try:
        key, value = parse_override(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(f"{e}; --variant takes data.synthetic keys, e.g. chains=1") from None
    if "." in key:
        raise argparse.ArgumentTypeError(f"'{text}': --variant takes a data.synthetic key without its section, "
                                         f"e.g. {key.rsplit('.', 1)[-1]}={text.partition('=')[2]}")
    return key, value


def flag_tree(args: argparse.Namespace) -> dict:
    """This command's own flags as a tree of eval keys (only those given)."""
    nested = {"tasks": args.tasks, "samples": args.samples, "depths": args.depths,
              "kmax_threshold": args.kmax_threshold, "seed": args.seed, "asked": args.asked,
              "variant": dict(args.variant) if args.variant else None}
    nested = {k: v for k, v in nested.items() if v is not None}
    for name in nested.get("tasks", []):
        check_task_name(name)  # suggests the closest name
    return {"tasks": nested} if nested else {}


TASKS = Evaluation(
    command="tasks",
    name="tasks", doc=__doc__, result="kmax", default_out=Path("reports/tasks"), cache_key=_cache_key,
    evaluate=lambda run_dir, ev, device, cells: evaluate_run(run_dir, ev, device),
    report=run_task_evaluation, add_flags=add_flags, flag_tree=flag_tree, preflight=preflight,
    refresh=refresh_chance, report_kind=TASK_REPORT,
    memory_fix="Evaluate shorter lengths (--lengths), or fewer instances (--samples).")


@entry_point
def main(argv=None) -> int:
    return evaluation.command(TASKS, argv)


if __name__ == "__main__":
    sys.exit(main())
