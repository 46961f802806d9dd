"""The engine of ``ropelab ablate`` (scripts/ablate.py, whose docstring says what the command
does): plan a grid and check it before any training, restore its archived records, then the
one thing asked (--archive, --status, --cancel, --dry-run) or training here or on Slurm, and
the reports from every finished run with the summary of what finished, what was left for
later and what failed.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shlex
from pathlib import Path
from typing import Optional

from ropelab.common.errors import UserError
from ropelab.common.logs import get_logger
from ropelab.configs.grid import Grid, PlannedRun, fold_seeds, load_grid, row_of
from ropelab.configs.schema import EvalConfig, RunConfig
from ropelab.configs.slurm import SlurmConfig
from ropelab.eval.diagnostics.measure import run_diagnostics
from ropelab.eval.lm.extrapolation import run_extrapolation
from ropelab.eval.reporting.report_dir import DIAGNOSTICS, PERPLEXITY, TASKS, check_report_dir
from ropelab.eval.tasks.exact_match import check_planned, run_task_evaluation, wants_tasks
from ropelab.grid.archive import archive_runs, check_archive, record_of, restore_records
from ropelab.grid.deadline import Deadline, describe, needs_from, plans_from
from ropelab.grid.estimate import estimate_grid, rows_ended
from ropelab.grid.estimate_table import print_estimates, print_wall_times, save_estimates, saved_estimates
from ropelab.grid.jobs import evaluation_cached, not_cached
from ropelab.grid.local import run_all, slots_for
from ropelab.grid.run_state import status
from ropelab.grid.slurm_launcher import cancel_grid, resources, submit_grid, wait_for_grid
from ropelab.grid.status import print_status
from ropelab.training.provenance import CODE, git_commit, is_dirty
from ropelab.training.run_dir import RunDir
from ropelab.training.run_record import is_record, record_has_weights

logger = get_logger(__name__)


def is_synthetic(run: PlannedRun) -> bool:
    return run.cfg.data.source == "synthetic"


def wants_diagnostics(run: PlannedRun) -> bool:
    """Whether the grid's report gets the attention diagnostics (``eval.diagnostics.enabled``)."""
    return run.cfg.eval.diagnostics.enabled


def planned_eval(runs: list[PlannedRun]):
    """The evaluation config of each planned run (its config + the grid's eval), by run name."""
    by_name = {run.cfg.name: run.cfg.eval for run in runs}

    def eval_for(cfg: RunConfig) -> EvalConfig:
        return by_name[cfg.name]
    return eval_for


def unevaluated_records(grid: Grid, runs: list[PlannedRun], states: dict[str, tuple[str, str]]) -> None:
    """Mark as a conflict each finished run restored from the archive without weights (or, in
    a dry run, each such record the grid would restore) that lacks an evaluation the grid
    plans under its eval settings as they are now (more instances, other lengths since it was
    archived): it cannot be evaluated anew, so it would fail only after the others had
    trained. Said before anything trains, with what to do."""
    for run in runs:
        state, archived = states[run.name][0], record_of(grid, run) if grid.archive else None
        record = RunDir(archived) if state == "archived" else RunDir.of(run.cfg)
        if state not in ("archived", "done") or not is_record(record) or record_has_weights(record):
            continue
        lacking = not_cached(run, record=archived if state == "archived" else None)
        if not lacking:
            continue
        what = " or ".join({"extrapolation": "perplexity", "tasks": "task"}.get(name, name) for name in lacking)
        which = f"the record {archived}" if state == "archived" else f"{record} was restored from the archive"
        remove = (f"remove {'it and ' if state == 'done' else ''}its record {archived}"
                  if archived is not None and archived.is_dir() else "remove it (the archive no longer holds its record)")
        states[run.name] = ("conflict", f"{which} without weights and holds no {what} evaluation under the grid's "
                                        f"eval settings as they are now, so it cannot be in the reports; to train it "
                                        f"again, {remove}")


def evaluate(grid: Grid, runs: list[PlannedRun], finished: list[PlannedRun], failures: dict[str, str],
             device: str, finish: Optional[str] = None) -> None:
    """The grid's reports from the runs' cached evaluations: perplexity for runs trained on
    text, task accuracy for those that want it (see the module doc). ``failures``: the runs
    missing and why; those ``not finished`` (not failed) carry ``finish``, the command that
    writes the reports again once they are (the reports then say they are incomplete)."""
    eval_for = planned_eval(runs)
    reports = {}
    for kind, wanted, evaluate_runs, out in (
            ("perplexity", lambda r: not is_synthetic(r), run_extrapolation, grid.report_dir),
            ("tasks", lambda r: wants_tasks(r.cfg, r.cfg.eval), run_task_evaluation, grid.report_dir / "tasks"),
            ("diagnostics", wants_diagnostics, run_diagnostics, grid.report_dir / "diagnostics")):
        chosen = [r for r in finished if wanted(r)]
        if not chosen:
            continue
        missing = [{"run": str(RunDir.of(r.cfg)), "error": failures[r.name],
                    **({"finish": finish} if finish and failures[r.name] in NOT_FINISHED else {})}
                   for r in runs if r.name in failures and wanted(r)]
        results = evaluate_runs([RunDir.of(r.cfg).path for r in chosen], out, eval_for, device=device, missing=missing)
        logger.info(f"{kind} report: {out / 'report.md'} ({len(results['runs'])} runs)")
        reports[kind] = results["runs"]
    if reports:
        print_wall_times(reports, saved_estimates(grid))


NOT_FINISHED = "not finished"  # a run missing from the reports because it had not finished, not because it failed


def chosen_runs(grid: Grid, runs: list[PlannedRun], patterns: Optional[list[str]]) -> set[str]:
    """The names of the runs ``--rows`` picks (all of them without it). A pattern picks a run
    when it matches the run's row (its name without seed parts) or its whole name, so that one
    parent's fine-tunes can be chosen by the parent's seed (``'*parents*_seed-0_*'``), which
    their row drops. A pattern that matches neither for any run is refused, with the grid's rows."""
    if not patterns:
        return {run.name for run in runs}

    def picks(pattern: str, name: str) -> bool:
        return fnmatch.fnmatchcase(row_of(name), pattern) or fnmatch.fnmatchcase(name, pattern)

    rows = list(dict.fromkeys(row_of(run.name) for run in runs))
    unmatched = [p for p in patterns if not any(picks(p, run.name) for run in runs)]
    if unmatched:
        raise UserError(f"--rows {' '.join(unmatched)}: no row of {grid.source} matches (nor any run's "
                        f"whole name); its rows are {', '.join(rows)}")
    return {run.name for run in runs if any(picks(p, run.name) for p in patterns)}


def archive_grid(grid: Grid, runs: list[PlannedRun], states: dict[str, tuple[str, str]]) -> int:
    """``--archive``: copy the finished, evaluated runs into the grid's archive; say which
    were not, and why."""
    if grid.archive is None:
        raise UserError(f"{grid.source}: --archive needs the grid's 'archive' key, the directory its runs' "
                        "records go to (e.g. archive: docs/results/NAME-runs)")
    finished = {name for name, (state, _) in states.items() if state == "done"}
    archived, skipped = archive_runs(grid, runs, finished)
    logger.info(f"archived {len(archived)} runs in {grid.archive}" + (f": {', '.join(archived)}" if archived else ""))
    for name, why in skipped.items():
        logger.info(f"  not archived: {name}: {why}")
    return 0


def in_training_order(runs: list[PlannedRun], states: dict[str, tuple[str, str]]) -> list[PlannedRun]:
    """Partially trained runs first, then the rest in the grid's order: a grid taken up again
    (another session, a machine that may not last) finishes what it began before it starts
    anything new, so fewer half-trained runs are left to lose."""
    return sorted(runs, key=lambda run: states[run.name][0] != "partial")


def on_cluster(grid: Grid, runs: list[PlannedRun], states: dict[str, tuple[str, str]],
               slurm: Optional[SlurmConfig], args: argparse.Namespace) -> bool:
    """Submit the grid to Slurm (--launcher slurm) and/or wait for its jobs (--report);
    whether the reports are to be written now."""
    if slurm is not None:
        submit_grid(grid, runs, states, slurm, evaluate=not args.skip_eval)
        if not args.report:
            logger.info(f"follow it with: ropelab ablate {args.grid} --status; once it is done, write the "
                        f"reports with: ropelab ablate {args.grid} --report")
            return False
    wait_for_grid(grid)
    return True


def check_before_training(grid: Grid, runs: list[PlannedRun], args: argparse.Namespace) -> None:
    """Every run's evaluation settings and the report directories it writes: checked before
    hours of training, not after."""
    for run in runs:
        check_planned(run.cfg, run.cfg.eval, f"{grid.source}: run {run.name}")
    if not (args.status or args.cancel):  # each run is archived once trained and evaluated
        check_archive(grid)
    if args.skip_eval:
        return
    if any(not is_synthetic(run) for run in runs):
        check_report_dir(grid.report_dir, PERPLEXITY)
    if any(wants_tasks(run.cfg, run.cfg.eval) for run in runs):
        check_report_dir(grid.report_dir / "tasks", TASKS)
    if any(wants_diagnostics(run) for run in runs):
        check_report_dir(grid.report_dir / "diagnostics", DIAGNOSTICS)


def log_plan(grid: Grid, runs: list[PlannedRun], states: dict[str, tuple[str, str]], chosen: set[str],
             base: str) -> None:
    """Each run and its state (``base``: the grid's base config, as the command line names it)."""
    logger.info(f"grid {grid.name}: {len(runs)} runs from {base} → {Path(grid.out_dir) / grid.name}")
    for run in runs:
        state, detail = states[run.name]
        logger.info(f"  {run.name:<40} {state:<8} {detail}" + ("" if run.name in chosen else "  (not in --rows)"))


def planned_estimates(grid: Grid, runs: list[PlannedRun], pending: list[PlannedRun], args: argparse.Namespace,
                      local: bool) -> tuple[dict, dict[str, list[int]]]:
    """The time estimate of the runs still to train here (printed, and saved unless a dry run),
    after a warning when the code they would record is not a clean commit; with the steps each
    row's ended runs stopped at, which the estimate read (a deadline renews it as runs end)."""
    commit = git_commit() if pending and not args.report else None
    if is_dirty(commit):  # said before hours of training, not found in the report
        logger.warning(f"warning: the code differs from commit {commit[:12]} (git status -- {' '.join(CODE)}): "
                       f"the runs trained now record {commit[:12]}-dirty and the reports call them not reproducible "
                       "from a clean commit; commit first, or train from a clean worktree")
    if not (pending and local and not args.report and not args.no_estimate):
        return {}, {}
    # Times each distinct shape once (cached), which also warms the compile caches the runs use.
    slots = slots_for(args)
    ended = rows_ended(grid, runs)
    estimates = estimate_grid(grid, pending, slots[0].threads, ended=ended,
                              jobs=sum(1 for slot in slots if slot.device in (None, "cpu")), dry_run=args.dry_run)
    print_estimates(estimates, len(slots))
    if not args.dry_run:
        save_estimates(grid, estimates)
    return estimates, ended


def print_outcome(runs: list[PlannedRun], finished: list[PlannedRun], unfinished: list[str], left_out: list[str],
                  left: dict[str, str], failures: dict[str, str], local_report: bool,
                  elsewhere: Optional[dict[str, str]] = None) -> None:
    """The summary: finished runs, those not in the reports and why, those left for later, those
    another process trains, failures."""
    print(f"\n{len(finished)}/{len(runs)} runs finished.")
    if local_report and unfinished:
        print(f"  not finished, so not in the reports ({len(unfinished)}): {', '.join(fold_seeds(unfinished))}")
    elif left_out:
        print(f"  not in --rows and not finished, so not in the reports ({len(left_out)}): "
              f"{', '.join(fold_seeds(left_out))}")
    if left:
        print(f"  left for later ({len(left)}; the same command continues them):")
        for name, why in left.items():
            print(f"    {name}: {why}")
    if elsewhere:
        print(f"  running elsewhere ({len(elsewhere)}; another process trains or evaluates them, and not a failure):")
        for name, holder in elsewhere.items():
            print(f"    {name}: {holder}")
    for name, reason in failures.items():
        print(f"  failed: {name}: {reason}")


def _waiting(left: dict[str, str], elsewhere: dict[str, str]) -> str:
    """Why the reports were not written: runs left for later, or trained or evaluated by another process."""
    if not elsewhere:
        return (f"{len(left)} run{'s were' if len(left) > 1 else ' was'} left for later (--report writes them from "
                "what is finished)")
    n = len(left) + len(elsewhere)
    return (f"{n} run{'s are' if n > 1 else ' is'} not finished, {len(elsewhere)} of them trained or evaluated by "
            "another process (the same command writes them once that process has ended; --report writes them now "
            "from what is finished, saying they are incomplete)")


def finish(grid: Grid, runs: list[PlannedRun], chosen: set[str], failures: dict[str, str], left: dict[str, str],
           local: bool, args: argparse.Namespace, elsewhere: Optional[dict[str, str]] = None) -> int:
    """Once the chosen runs have trained (or, with --report, whatever has finished): the reports
    from every finished run, listing those missing and why, then the summary; 1 if a chosen run
    failed. Runs another process trains (``elsewhere``) are not failures; while one of them is
    not finished the reports wait, as for runs left for later; one another process was evaluating
    is finished once its evaluations are cached."""
    elsewhere = elsewhere or {}
    finished = [run for run in runs if run.name not in failures and status(run)[0] == "done"
                and (run.name not in elsewhere or args.skip_eval or evaluation_cached(run))]
    unfinished = [run.name for run in runs if run.name not in failures and run not in finished]
    elsewhere = {name: holder for name, holder in elsewhere.items() if name in unfinished}  # not yet done there
    missing = {**failures, **{name: left.get(name, NOT_FINISHED) for name in unfinished}}  # the reports list them
    local_report = args.report and local  # what is not finished may be training in another process
    if not local_report:  # here, or on Slurm once its jobs have ended, an unfinished chosen run failed
        failures = {name: why for name, why in missing.items()
                    if name in chosen and name not in left and name not in elsewhere}
    left_out = [name for name in missing if name not in chosen]  # unfinished, or a conflict left alone
    if (left or elsewhere) and not args.skip_eval:  # stopped, not started or trained elsewhere: the reports wait
        logger.info(f"\nreports not written: {_waiting(left, elsewhere)}")
    elif not args.skip_eval and finished:
        if grid.archive and (not local or args.report):  # a local run was archived by its worker
            archived, _ = archive_runs(grid, finished, {run.name for run in finished})
            if archived:
                logger.info(f"{len(archived)} runs archived in {grid.archive}")
        evaluate(grid, runs, finished, missing, args.devices[0] if args.devices else "cpu",
                 finish=shlex.join(["ropelab", "ablate", str(args.grid), "--report"]))
    print_outcome(runs, finished, unfinished, left_out, left, failures, local_report, elsewhere)
    return 1 if failures else 0


def run_grid(args: argparse.Namespace) -> int:
    """The command: plan the grid and check it, restore its archived records, then the one thing
    asked (--archive, --status, --cancel, --dry-run) or training and the reports."""
    grid = load_grid(args.grid)
    runs = grid.plan(args.set)
    check_before_training(grid, runs, args)
    if grid.archive and not args.archive and not args.dry_run:
        restored, refreshed = restore_records(grid, runs)
        if restored:
            logger.info(f"restored {len(restored)} runs from the grid's archive {grid.archive}")
        if refreshed:
            logger.info(f"brought {len(refreshed)} restored records up to date with the archive (changed since): "
                        f"{', '.join(refreshed)}")
    states = {run.name: status(run) for run in runs}
    chosen = chosen_runs(grid, runs, args.rows)
    if args.archive:
        return archive_grid(grid, runs, states)
    if args.dry_run:
        for run in runs:  # what the grid would restore instead of training
            if states[run.name][0] == "new" and grid.archive and record_of(grid, run).is_dir():
                states[run.name] = ("archived", f"record in {grid.archive}, restored when the grid runs")
    if not args.skip_eval:
        unevaluated_records(grid, runs, states)
    if args.status:
        return print_status(grid, runs, states)
    if args.cancel:
        return cancel_grid(grid)
    slurm = resources(grid, args.slurm) if args.launcher == "slurm" else None
    base = os.path.relpath(grid.base.resolve())
    log_plan(grid, runs, states, chosen, base)
    pending = [run for run in runs if states[run.name][0] in ("new", "partial") and run.name in chosen]
    estimates, ended = planned_estimates(grid, runs, pending, args, local=slurm is None)
    if args.dry_run:
        example = (pending or [run for run in runs if run.name in chosen] or runs)[0]  # one --rows picked
        logger.info("train one by hand with: " + shlex.join(["python", "train.py", base, *example.overrides]))
        if estimates and all(e.failed for e in estimates.values()):  # every run refused by its own config
            reasons = sorted({e.reason for e in estimates.values()})
            raise UserError(f"none of the {len(estimates)} runs can start: {'; '.join(reasons)} (each run fails with "
                            "this when it trains); fix the grid's config or data and run the dry run again")
        return 0
    deadline = None
    if args.until is not None and not args.report:
        deadline = Deadline(args.until, needs_from(estimates, saved_estimates(grid)), plans_from(estimates), ended)
        logger.info(f"until {describe(args.until)}: runs start while their estimate ends by then"
                    + ("" if deadline.needs else " (no estimate: every run may start, and is stopped then)"))
    left: dict[str, str] = {}  # runs the deadline (or a SIGTERM sent by hand) left for later
    elsewhere: dict[str, str] = {}  # runs another process trains -> that process
    failures = {name: detail for name, (state, detail) in states.items() if state == "conflict"}
    todo = in_training_order([run for run in runs if states[run.name][0] in ("new", "partial", "done")
                              and run.name in chosen], states)
    if slurm is not None or args.report:
        if not on_cluster(grid, [run for run in runs if run.name in chosen], states, slurm, args):
            return 0
    elif todo:
        failures.update(run_all(grid, todo, slots_for(args), evaluate=not args.skip_eval, deadline=deadline,
                                left=left, elsewhere=elsewhere))
    return finish(grid, runs, chosen, failures, left, local=slurm is None, args=args, elsewhere=elsewhere)
