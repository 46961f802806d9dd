"""The one evaluation driver behind ``ropelab eval`` and ``ropelab tasks``.

Both commands evaluate run directories with each run's own ``eval`` config (configs/eval_config.py:
EvalConfig), overridden by ``--eval-file`` and then by the flags, and cache each run's result
in the run (RunDir.eval_cache) for its checkpoint and cache key. What they share is here:

- the common flags and their help (runs, --lengths, --scaling, --factor, --steps,
  --eval-file, --cache-only, --rescore, --device, --out), the full help on empty arguments;
- one tree of eval keys: the file's, then the flags' over them (a nested mapping such as
  ``tasks:`` merged key by key), checked against EvalConfig before any work;
- the device choice and the report-directory check, both before any work;
- the checks of the request before any work (``check_requests``): no run given twice or
  as a copy (eval/core/run_checks.py: pooled, a copy would count as another seed), each
  evaluation's own checks of a run's settings (``Evaluation.preflight``) and the memory the
  largest forward needs (training/memory.py), for the runs whose results are not cached
  already; a flag asking for what none of the runs has (``--scaling yarn`` for ALiBi runs)
  is refused (run_checks.py);
- the cache loop: per run, the cached result for (checkpoint, cache key), else the
  evaluation, written atomically; with ``--cache-only`` no report; with ``--rescore`` every
  run evaluated again, its new result replacing the cached one once complete;
- the command itself (``command``), each module's ``main`` wrapped in ``common.cli.entry_point``.

What each kind of evaluation brings (its evaluation of one run, its cache key, its report
writer, its own flags) is an ``Evaluation``, defined in its module.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import yaml

from ropelab.common.atomic import write_text_atomic
from ropelab.common.cli import device_name, non_negative_int, positive_int, scale_factor, usage_when_empty
from ropelab.common.devices import DEVICE_NAMES
from ropelab.common.errors import ConfigError, LengthError, UserError
from ropelab.common.logs import get_logger
from ropelab.configs import override_section
from ropelab.configs.loader import load_yaml
from ropelab.configs.experiment import seed_group
from ropelab.configs.schema import EvalConfig, RunConfig
from ropelab.eval.core.resume_journal import Cells
from ropelab.eval.reporting.report_dir import PERPLEXITY, ReportKind, check_report_dir
from ropelab.eval.core.run_checks import check_distinct, check_flags
from ropelab.eval.reporting.like_for_like import run_setup
from ropelab.model.config import SCALING_TYPES
from ropelab.model.encodings import KINDS, served_length
from ropelab.training.competence import logged_progress
from ropelab.training.memory import Estimate, check_fits
from ropelab.training.run_dir import RunDir
from ropelab.training.runtime import resolve_device
from ropelab.training.saved_run import SavedRun, load_run, read_run_config

logger = get_logger(__name__)

EvalFor = Callable[[RunConfig], EvalConfig]  # the evaluation config of a run, from its config
Result = tuple[dict, list, Any]  # (run metadata, result rows, what else the evaluation keeps)

COMMON_KEYS = ("lengths", "scalings", "factor", "steps")  # the eval keys of the common flags


def own_eval(cfg: RunConfig) -> EvalConfig:
    return cfg.eval


def pooling_group(cfg: RunConfig, tokens, parent: Optional[dict] = None) -> str:
    """Seeds of one experiment, trained for as many tokens, are pooled into one row. Runs
    trained to competence (train.stop_at_accuracy) stop when they stop, so their tokens do not
    count; fine-tunes of parents that are seeds of one experiment (``parent``: the run's
    record of its parent, training/warm_start.py) are seeds of one experiment too."""
    if cfg.train.stop_at_accuracy is not None:
        tokens = f"to-accuracy-{cfg.train.stop_at_accuracy:g}"
    if parent and parent.get("group"):
        cfg = dataclasses.replace(cfg, init=dataclasses.replace(cfg.init, run=f"seeds of {parent['group']}"))
    return f"{seed_group(cfg)}-{tokens}"


def _no_options(args: argparse.Namespace) -> dict:
    return {}


def _no_warnings(results: dict) -> list[str]:
    return []


def _no_preflight(cfg: RunConfig, ev: EvalConfig) -> Optional[Estimate]:
    return None


@dataclass(frozen=True)
class Evaluation:
    """One kind of evaluation, as the driver runs it: only what is its own."""

    name: str  # its cache files are RunDir.eval_cache(name, key)
    doc: str  # the module's docstring: its first paragraph describes the command
    result: str  # what a cache file calls the third part of a result ("curves", "kmax")
    default_out: Path
    cache_key: Callable[[RunConfig, EvalConfig], str]
    # One run: (run_dir, ev, device, cells, **options) -> Result; ``cells`` is a journal of
    # finished cells, kept beside the cache file (resumable) when ``journal`` is true.
    evaluate: Callable[..., Result]
    # Every run and the report: (run_dirs, out, eval_for, device=, **options) -> results.
    report: Callable[..., dict]
    # Its own flags and those flags as eval keys (only those given); an evaluation with a
    # command line of its own (ropelab diagnose) uses only the cache loop and has none here.
    add_flags: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    flag_tree: Callable[[argparse.Namespace], dict] = _no_options
    options: Callable[[argparse.Namespace], dict] = _no_options  # keyword options of evaluate and report
    warnings: Callable[[dict], list[str]] = _no_warnings  # printed after the report
    journal: bool = False
    command: str = ""  # its ``ropelab`` subcommand (scripts/cli.py)
    # Before any evaluation, per run: raise a UserError for settings that contradict each
    # other or the run; return the memory its largest forward needs (None: not estimated).
    preflight: Callable[[RunConfig, EvalConfig], Optional[Estimate]] = _no_preflight
    memory_fix: str = "Evaluate shorter lengths (--lengths)."  # how to need less memory
    report_kind: ReportKind = PERPLEXITY  # the report it writes (eval/reporting/report_dir.py)
    # A reused result's metadata that follows from the run's config and today's code, not from
    # its scores: (meta, run, cfg, ev) -> None, updating meta (tasks: each task's chance).
    refresh: Callable[[dict, RunDir, RunConfig, EvalConfig], None] = lambda meta, run, cfg, ev: None


# --------------------------------------------------------------- checkpoints of one run

def evaluated_checkpoints(run_dir: Path, ev: EvalConfig, latest: SavedRun,
                          device: str) -> Iterator[tuple[Optional[int], SavedRun]]:
    """(step, checkpoint) for every checkpoint an evaluation scores: those of the training
    steps ``ev.steps``, else the latest alone (step None)."""
    for step in ev.steps or [None]:
        yield step, latest if step is None else load_run(run_dir, device=device, step=step)


def mark_step(rows: list[dict], step: Optional[int], checkpoint: SavedRun) -> None:
    """Rows scored at a checkpoint of ``eval.steps`` say which: reports make each step a row
    of its own ("ROW @ STEP", eval/reporting/labels.py)."""
    for row in rows if step is not None else ():
        row.update(eval_step=step, step_tokens=checkpoint.meta.get("tokens"))


def check_served(cfg: RunConfig, lengths: Sequence[int]) -> None:
    """Raise LengthError when the run's encoding serves none of ``lengths`` (a learned table
    shorter than all of them): there would be nothing to evaluate. (The run's name is added
    where its failure is listed.)"""
    limit, served = served_length(cfg.model.pos), KINDS[cfg.model.pos.kind].limit
    if limit is not None and lengths and all(n > limit for n in lengths):
        raise LengthError(f"pos.kind={cfg.model.pos.kind} {served.what.format(n=limit)}, and every "
                          f"evaluated length ({', '.join(map(str, lengths))}) is longer; {served.why}: "
                          f"evaluate lengths up to {limit}")


# --------------------------------------------------------------- checks before any work

def check_requests(evaluation: Evaluation, run_dirs: Sequence[Path], eval_for: EvalFor, device: str) -> None:
    """Before any evaluation: distinct runs, each run's settings (``evaluation.preflight``),
    and the memory of the largest forward of every run that is not cached already."""
    check_distinct(run_dirs)
    for run_dir in run_dirs:
        run = RunDir(run_dir)
        try:
            cfg = read_run_config(run)
        except UserError:
            continue  # reported as missing by the evaluation itself
        ev = eval_for(cfg)
        estimate = evaluation.preflight(cfg, ev)
        if estimate is not None and cached_result(evaluation, run, cfg, ev) is None:
            check_fits(estimate, device, evaluation.memory_fix)


# --------------------------------------------------------------- the cache loop

def cached_result(evaluation: Evaluation, run: RunDir, cfg: RunConfig, ev: EvalConfig) -> Optional[dict]:
    """The cached ``evaluation`` of ``run``'s newest checkpoint under ``ev``, or None (a
    launcher asks this before it submits an evaluation job)."""
    path = run.eval_cache(evaluation.name, evaluation.cache_key(cfg, ev))
    ckpt = run.latest_checkpoint()
    if ckpt is None or not path.exists():
        return None
    try:
        cached = json.loads(path.read_text())
        finite = all(math.isfinite(row[key]) for row in cached["rows"] for key in ("nll", "ppl") if key in row)
    except (ValueError, KeyError, TypeError) as e:  # cut short, or whole but not this cache's JSON
        raise UserError(f"the evaluation cache {path} is damaged ({type(e).__name__}: {e}); delete it, and the "
                        "run is evaluated again from its checkpoint") from None
    if not finite:
        return None  # scored before non-finite weights were refused: not a result
    # Given steps do not change as a run grows.
    return cached if cached.get("checkpoint") == ckpt.name or ev.steps else None


def cached_evaluation(evaluation: Evaluation, run_dir: Path, eval_for: EvalFor, device: str,
                      rescore: bool = False, **options) -> Result:
    """``evaluation.evaluate`` of one run, or its earlier result for the same checkpoint and cache
    key; ``rescore``: evaluated again all the same, the new result replacing the earlier one once
    it is complete (what a newer evaluation records beside the same numbers)."""
    run = RunDir(run_dir)
    cfg = read_run_config(run)
    ev = eval_for(cfg)
    path = run.eval_cache(evaluation.name, evaluation.cache_key(cfg, ev))
    ckpt = run.latest_checkpoint()
    cached = None if rescore else cached_result(evaluation, run, cfg, ev)
    if cached is not None:
        logger.info(f"  reusing {path}")
        # The group hashes the whole config as the schema reads it today: a key added
        # since (e.g. model.attention) must not split a cached seed from a fresh one.
        cached["meta"]["group"] = pooling_group(cfg, cached["meta"].get("tokens_trained"), cached["meta"].get("parent"))
        cached["meta"]["setup"] = run_setup(cfg)  # cached before runs recorded it: the config says
        if "encoding" in cached["meta"]:  # a layer plan's row name, as the schema names it today
            cached["meta"]["encoding"] = cfg.model.encoding_name()
        # The settings outside the key (the report's reference row, …) are today's.
        cached["meta"]["eval"] = dataclasses.asdict(ev)
        # Scored before the report drew how a run learned (caches since hold it): its metrics say.
        if "competence_curve" not in cached["meta"]:
            for key, value in logged_progress(run.metrics, cached["meta"].get("competence")).items():
                cached["meta"].setdefault(key, value)
        evaluation.refresh(cached["meta"], run, cfg, ev)
        return cached["meta"], cached["rows"], cached[evaluation.result]
    cells = Cells(path.with_suffix(".partial.jsonl"), ckpt.name if ckpt is not None else None) \
        if evaluation.journal else Cells()
    meta, rows, extra = evaluation.evaluate(run.path, ev, device, cells, **options)
    path.parent.mkdir(exist_ok=True)
    write_text_atomic(path, json.dumps({"checkpoint": meta["checkpoint"], "meta": meta, "rows": rows,
                                        evaluation.result: extra}))
    cells.discard()
    return meta, rows, extra


@dataclass
class Evaluated:
    """What every run's evaluation gave, in the order of the runs, and the runs that gave nothing."""

    runs: list[dict] = field(default_factory=list)  # metadata
    rows: list[dict] = field(default_factory=list)
    extras: list = field(default_factory=list)  # each run's third part of its result
    failures: list[dict] = field(default_factory=list)  # {"run", "error"}


def evaluate_all(evaluation: Evaluation, run_dirs: Sequence[Path], eval_for: EvalFor, device: str,
                 missing: Sequence[dict] = (), **options) -> Evaluated:
    """Every run's cached evaluation. A run that cannot be evaluated (a UserError) is listed
    with ``missing`` (runs that should have been there) for the report; none at all is an error."""
    check_requests(evaluation, run_dirs, eval_for, device)
    done = Evaluated(failures=list(missing))
    for run_dir in run_dirs:
        logger.info(f"evaluating {run_dir}")
        try:
            meta, rows, extra = cached_evaluation(evaluation, Path(run_dir), eval_for, device, **options)
        except UserError as e:
            done.failures.append({"run": str(run_dir), "error": str(e)})
            logger.info(f"  skipped: {e}")
            continue
        done.runs.append(meta)
        done.rows.extend(rows)
        done.extras.append(extra)
    if not done.runs:
        why = [f"{f['run']}: {f['error']}" for f in done.failures]
        raise UserError("no run could be evaluated: " + (why[0] if len(why) == 1 else
                                                         "\n" + "\n".join(f"- {w}" for w in why)))
    return done


# --------------------------------------------------------------- the command line

def parser(evaluation: Evaluation) -> argparse.ArgumentParser:
    """The common flags around the evaluation's own (``evaluation.add_flags``)."""
    p = argparse.ArgumentParser(prog=f"ropelab {evaluation.command}",
                                description=evaluation.doc.split("\n\n")[0],
                                epilog="Flags override the keys of each run's own eval config (eval.*).")
    p.add_argument("runs", nargs="+", type=Path, help="run directories (runs/NAME)")
    p.add_argument("--lengths", type=positive_int, nargs="+",
                   help="eval.lengths: evaluated lengths (default: eval.length_multipliers × the training length)")
    p.add_argument("--scaling", nargs="+", choices=SCALING_TYPES, dest="scalings",
                   help="eval.scalings: RoPE scalings to compare (RoPE runs only)")
    p.add_argument("--factor", type=scale_factor,
                   help="eval.factor: fixed RoPE scaling factor >= 1 (default: L_eval / L_train)")
    p.add_argument("--steps", type=non_negative_int, nargs="+", metavar="N",
                   help="eval.steps: evaluate the checkpoints of these training steps, e.g. a fine-tuning "
                        "budget curve (train.keep_last must have kept them; default: the latest checkpoint)")
    evaluation.add_flags(p)
    p.add_argument("--eval-file", type=Path, help="a YAML mapping of eval keys applied before the flags "
                                                 "(a grid's jobs pass each run's planned evaluation)")
    p.add_argument("--cache-only", action="store_true",
                   help="evaluate and cache the results in each run directory, without writing a report "
                        "(what a grid's jobs do)")
    p.add_argument("--rescore", action="store_true",
                   help="evaluate every run again even where its cached result for these settings exists, "
                        "replacing it (a newer evaluation may record more beside the same numbers); needs the "
                        "runs' weights")
    p.add_argument("--device", type=device_name, default="cpu", help=f"torch device for evaluation: {DEVICE_NAMES}")
    p.add_argument("--out", type=Path, default=evaluation.default_out,
                   help="report directory: a new one, or an earlier report's, which is replaced")
    return p


def parse_args(evaluation: Evaluation, argv=None) -> argparse.Namespace:
    p = parser(evaluation)
    usage_when_empty(p, argv)
    return p.parse_args(argv)


def read_eval_file(path: Path) -> dict:
    try:
        tree = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, ConfigError) as e:
        raise UserError(f"--eval-file {path}: cannot read it ({e})") from None
    if not isinstance(tree, dict):
        raise UserError(f"--eval-file {path}: expected a mapping of eval keys")
    return tree


def merged(base: dict, over: dict) -> dict:
    """``base`` with ``over``'s keys: a mapping in both is merged key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both else value
    return out


def eval_tree(evaluation: Evaluation, args: argparse.Namespace) -> dict:
    """The eval keys to apply to every run: --eval-file's, then the flags', checked against
    EvalConfig now, so a bad value fails before any work."""
    tree = read_eval_file(args.eval_file) if args.eval_file else {}
    flags = {key: getattr(args, key) for key in COMMON_KEYS if getattr(args, key) is not None}
    tree = merged(tree, merged(flags, evaluation.flag_tree(args)))
    override_section(EvalConfig(), tree, "command line", "eval.")
    return tree


def command(evaluation: Evaluation, argv=None) -> int:
    """The command ``python -m eval.NAME``: each module's ``main``, wrapped in ``entry_point``."""
    args = parse_args(evaluation, argv)
    tree = eval_tree(evaluation, args)
    options = evaluation.options(args)
    device = str(resolve_device(args.device, "--device"))
    if not args.cache_only:
        check_report_dir(args.out, evaluation.report_kind)  # before anything is evaluated

    def eval_for(cfg: RunConfig) -> EvalConfig:
        return override_section(cfg.eval, tree, "command line", "eval.")

    check_flags(args, args.runs)
    with torch.inference_mode():
        if args.cache_only or args.rescore:  # the report below reuses what this writes
            check_requests(evaluation, args.runs, eval_for, device)
            for run in args.runs:
                cached_evaluation(evaluation, run, eval_for, device, rescore=args.rescore, **options)
            if args.cache_only:
                return 0
        results = evaluation.report(args.runs, args.out, eval_for, device=device, **options)
    logger.info(f"wrote {args.out}/report.md, results.json and plots")
    for warning in evaluation.warnings(results):
        logger.warning(f"warning: {warning}")
    return 0
