"""The report's "Runs" section: which commits trained and evaluated the runs, where fine-tunes
started, and a table of the runs with their sizes and wall times (a task report's with each
run's competence outcome instead)."""

from __future__ import annotations

from typing import Optional

from ropelab.configs.grid import fold_seeds
from ropelab.eval.reporting.tables import durations
from ropelab.training.provenance import is_dirty


def evaluation_provenance(rows: list[dict]) -> list[str]:
    """Which code computed the evaluations: the commits recorded by each cell."""
    commits = sorted({r.get("eval_commit") or "unknown" for r in rows if r.get("status") == "ok"})
    if not commits:
        return []
    before = "before each cell recorded the commit that scored it"
    if commits == ["unknown"]:
        return [f"The evaluations were computed {before}."]
    known = [c for c in commits if c != "unknown"]
    text = "The evaluations were computed at " + ", ".join(f"`{c[:18]}`" for c in known)
    text += " (**not all from a clean tree**)." if any(is_dirty(c) for c in known) else ", each a clean tree."
    return [text + (f" Some were computed {before}." if "unknown" in commits else "")]


def trained_at(run: dict) -> list[str]:
    """The commits that trained ``run``, oldest first: every session's where its checkpoint
    records them (training/trainer.py), else the last session's only."""
    return run.get("commits") or [run.get("git_commit") or "unknown"]


def provenance(runs: list[dict]) -> list[str]:
    """Which code trained the runs, their learning-rate schedules and their parents."""
    return commit_lines(runs) + schedule_lines(runs) + _parents(runs)


def commit_lines(runs: list[dict]) -> list[str]:
    """Which commits trained the runs, whether each was a clean tree, and runs resumed under other code."""
    commits = sorted({c for r in runs for c in trained_at(r)})
    dirty = [c for c in commits if c == "unknown" or is_dirty(c)]
    if len(commits) == 1 and not dirty:
        which = "The run was" if len(runs) == 1 else f"All {len(runs)} runs were"
        lines = [f"{which} trained from commit `{commits[0][:12]}`, a clean tree."]
    else:
        lines = [f"Runs were trained from {len(commits)} commits: " + ", ".join(f"`{c[:18]}`" for c in commits)
                 + ("." if dirty else ", each a clean tree.")]
    if dirty:
        lines.append("**Not reproducible from a clean commit**: " + ", ".join(f"`{c}`" for c in dirty)
                     + " (uncommitted changes, or no git).")
    resumed = [f"`{r['name']}` ({' then '.join(f'`{c[:12]}`' for c in trained_at(r))})"
               for r in runs if len(trained_at(r)) > 1]
    if resumed:
        lines.append("Resumed under other code (its steps were trained at more than one commit): "
                     + ", ".join(resumed) + ".")
    return lines


def planned_schedules(run: dict) -> Optional[tuple[tuple[int, int], ...]]:
    """The learning-rate schedules ``run`` trained under, ((from step, planned total steps), ...)
    oldest first (training/trainer.py: ``schedules``); None where its checkpoint predates the record."""
    plans = run.get("schedules") or ([[0, run["total_steps"]]] if run.get("total_steps") else None)
    return tuple((int(a), int(b)) for a, b in plans) if plans else None


def _schedule_text(plans: tuple[tuple[int, int], ...]) -> str:
    text = f"{plans[0][1]:,} steps"
    return text + "".join(f", re-planned for {total:,} at step {start:,}" for start, total in plans[1:])


def schedule_lines(runs: list[dict]) -> list[str]:
    """Where the runs' learning-rate schedules make a row other than it looks: seeds pooled in
    one row that were planned for different budgets (runs stopped at competence pool whatever
    their budget, so a grid that raised train.max_steps keeps its stopped runs beside new ones),
    and runs re-planned mid-run (a cosine decay given a new length where it was is
    not the decay a fresh run at the final budget follows)."""
    groups: dict[str, dict[tuple, list[str]]] = {}
    for run in runs:
        plans = planned_schedules(run)
        if plans is not None:
            groups.setdefault(run.get("group") or run["name"], {}).setdefault(plans, []).append(run["name"])
    lines = []
    for by_plan in groups.values():
        if len(by_plan) > 1:
            lines.append("**Seeds of one row trained under different learning-rate schedules** (the row pools runs "
                         "of different experiments; retrain them at one budget to compare like with like): "
                         + "; ".join(f"{', '.join(f'`{n}`' for n in fold_seeds(names))} {_schedule_text(plans)}"
                                     for plans, names in by_plan.items()) + ".")
    replanned = [f"`{run['name']}` ({_schedule_text(plans)})" for run in runs
                 if (plans := planned_schedules(run)) is not None and len(plans) > 1]
    if replanned:
        lines.append("Re-planned mid-run (the learning-rate schedule took a new length from the step it had reached): " + ", ".join(replanned) + ".")
    return lines


def _parents(runs: list[dict]) -> list[str]:
    """Where fine-tuned runs started (init.run): each parent once, with its own provenance."""
    parents = {}
    for run in runs:
        if run.get("parent"):
            parents.setdefault((run["parent"]["run"], run["parent"]["checkpoint"]), (run["parent"], []))[1].append(
                run["name"])
    lines = []
    for (where, checkpoint), (parent, children) in parents.items():
        commit = parent.get("git_commit") or "unknown"
        tokens = f"{parent['tokens']:,} tokens" if parent.get("tokens") else "its tokens unrecorded"
        lines.append(f"Fine-tuned from `{where}` ({checkpoint}: step {parent.get('step')}, {tokens} at training "
                     f"length {parent.get('train_len')}, commit `{commit[:12]}`"
                     f"{', **not a clean tree**' if is_dirty(commit) else ''}): "
                     + ", ".join(children) + ".")
    return [""] + lines if lines else []


def _minutes(seconds) -> str:
    return "–" if seconds is None else f"{seconds / 60:.1f}"


def runs_table(runs: list[dict]) -> list[str]:
    lines = ["| run | row | encoding | attention | seed | params | tokens trained | train length | commit "
             "| train min | eval min |",
             "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|"]
    for run in runs:
        lines.append(f"| {run['name']} | {run.get('label', '')} | {run['encoding']} | {run.get('attention', 'softmax')} "
                     f"| {run['seed']} | {run['params']:,} | {(run['tokens_trained'] or 0):,} | {run['train_len']} "
                     f"| {(run['git_commit'] or '')[:10]} | {_minutes(run.get('train_seconds'))} "
                     f"| {_minutes(run.get('eval_seconds'))} |")
    train = sum(r.get("train_seconds") or 0 for r in runs)
    evaluation = sum(r.get("eval_seconds") or 0 for r in runs)
    train, evaluation, together = durations(train, evaluation, train + evaluation)
    lines += ["", f"Wall time (this machine): training {train}, evaluation {evaluation}, together {together}."]
    return lines


def competence_text(run: dict) -> str:
    """A run's competence outcome for a task report's runs table: the step it stopped at, or
    **not reached** with its accuracy at the end and at its check four fifths of the way."""
    record = run.get("competence")
    if not record:
        return "–"
    checks = record.get("checks", 1)  # train.stop_checks: the passing checks in a row that stop a run
    if record.get("reached"):
        return f"at step {record['step']:,}" + (f" ({checks} checks in a row)" if checks > 1 else "")
    # Three decimals: the competence check scores 256 instances (steps of 0.004), so two would
    # print 0.977 against a threshold of 0.98 as "0.98 < 0.98".
    accuracy = ", ".join(f"{a:.3f}" for a in (record.get("accuracy") or {}).values())
    earlier = run.get("competence_earlier")  # the check four fifths of the way: still learning, or stalled?
    before = (f"; {', '.join(f'{a:.3f}' for a in earlier['accuracy'].values())} at step {earlier['step']:,}"
              if earlier else "")
    if record.get("streak"):  # the budget ended between the first passing check and the last one asked for
        return (f"**not reached** ({accuracy} ≥ {record['threshold']:g} at {record['streak']} of {checks} checks"
                f"{before})")
    return f"**not reached** ({accuracy} < {record['threshold']:g}{before})"


def task_runs_table(runs: list[dict]) -> list[str]:
    out = ["| run | encoding | trained on | seed | params | tokens trained | train length | competence at L | commit |",
           "|---|---|---|---:|---:|---:|---:|---|---|"]
    for run in runs:
        out.append(f"| {run['name']} | {run['encoding']} | {run.get('trained_on', '')} | {run['seed']} | "
                   f"{run['params']:,} | {(run['tokens_trained'] or 0):,} | {run['train_len']} | {competence_text(run)} | "
                   f"{(run['git_commit'] or '')[:10]} |")
    return out


def missing_lines(missing: list[dict]) -> list[str]:
    """A report's list of missing runs ({run, error} each, as results.json keeps them): a line
    per reason and row, the seeds folded (``.../alibi_seed-{2,3}: not finished``), so a grid
    reported while half trained lists its rows rather than every run."""
    by_error: dict[str, list[str]] = {}
    for m in missing:
        by_error.setdefault(str(m["error"]), []).append(str(m["run"]))
    return [f"- {name}: {error}" for error, runs in by_error.items() for name in fold_seeds(runs)]


def incomplete_note(missing: list[dict]) -> list[str]:
    """Above a report's runs: that runs of it had not finished when it was written (a grid
    reported while some train, or with --rows), and the command that writes it again with
    them (``finish``, as the grid recorded it with each such missing run); none otherwise."""
    waiting = [m for m in missing or () if m.get("finish")]
    if not waiting:
        return []
    n = len(waiting)
    return ["", f"**Incomplete**: {n} run{'s' if n > 1 else ''} of this report had not finished when it was written "
            f"(listed under Missing runs); once {'they have' if n > 1 else 'it has'}, `{waiting[0]['finish']}` "
            "writes it again with them."]
