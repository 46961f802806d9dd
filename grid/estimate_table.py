"""A grid's estimates shown and kept: the table a dry run prints (grid/estimate.py makes the
estimates), the file that keeps them beside the grid's runs, and each run's wall times set
beside its estimate once it has run (ropelab ablate's summary)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ropelab.common.atomic import write_text_atomic
from ropelab.configs.grid import Grid, fold_seeds
from ropelab.grid.estimate import Estimate


def print_estimates(estimates: dict[str, Estimate], jobs: int) -> None:
    """The estimate table: a line per run that could be estimated, the notes every one of them
    shares said once above it, then the totals, and the runs that could not be estimated."""
    made = {name: e for name, e in estimates.items() if not e.failed}
    failed = [name for name, e in estimates.items() if e.failed]
    if not made:
        print(f"\nno estimate: none of the {len(estimates)} runs could be estimated (the reasons are above)")
        return
    parts = {name: e.note.split("; ") for name, e in made.items()}
    shared = [p for p in next(iter(parts.values())) if all(p in q for q in parts.values())]
    if shared and len(made) > 1:
        print(f"\nevery run below: {'; '.join(shared)}")
    print(f"\n{'estimated on this machine':<40} {'train (min)':>11} {'eval (min)':>10}")
    for name, e in made.items():
        own = "; ".join(p for p in parts[name] if p not in shared or len(made) == 1)
        print(f"{name:<40} {e.train_s / 60:11.1f} {e.eval_s / 60:10.1f}   {own}")
    train, evaluation = (sum(getattr(e, k) for e in made.values()) / 3600 for k in ("train_s", "eval_s"))
    total = "grid total (hours)" if not failed else f"total of the {len(made)} estimated (hours)"
    print(f"{total:<40} {train:11.2f} {evaluation:10.2f}   about {(train + evaluation) / jobs:.2f} h "
          f"of wall time with {jobs} job{'s' if jobs > 1 else ''} at once")
    if failed:
        print(f"not estimated ({len(failed)}, reasons above): {', '.join(fold_seeds(failed))}")
    informed = [e for e in made.values() if e.expected_train_s is not None]
    if informed:
        expected = sum(e.train_s if e.expected_train_s is None else e.expected_train_s for e in made.values())
        print(f"{'expected where rows have ended runs':<40} {expected / 3600:11.2f} {evaluation:10.2f}   about "
              f"{(expected / 3600 + evaluation) / jobs:.2f} h of wall time, if the {len(informed)} "
              f"run{'s' if len(informed) > 1 else ''} in such rows stop at their row's mean step (the "
              "others at their whole budget)")


def print_wall_times(reports: dict[str, list[dict]], estimates: Optional[dict[str, dict]] = None) -> None:
    """Each run's wall times in minutes: its training (over all sessions) and the evaluation of
    each report kind (perplexity, tasks) that produced its numbers (the runs' own records),
    beside the estimate made before it started; then the grid's totals in hours."""
    kinds = list(reports)
    per_run: dict[str, dict] = {}
    for kind, runs in reports.items():
        for run in runs:
            entry = per_run.setdefault(run["name"], {"train": run.get("train_seconds")})
            entry[kind] = run.get("eval_seconds")
    for name, entry in per_run.items():
        planned = (estimates or {}).get(name, {})
        entry.update(est_train=planned.get("train_s"), est_eval=planned.get("eval_s"))
    heads = ["train (min)"] + [f"{kind} eval (min)" for kind in kinds] + ["estimated train", "estimated eval"]
    widths = [max(9, len(h)) for h in heads]
    columns = ["train", *kinds, "est_train", "est_eval"]
    print(f"\n{'wall time of each run':<40} " + " ".join(f"{h:>{w}}" for h, w in zip(heads, widths)))
    for name, entry in per_run.items():
        print(f"{name:<40} " + " ".join(f"{entry[k] / 60:{w}.1f}" if entry.get(k) else f"{'–':>{w}}"
                                         for k, w in zip(columns, widths)))
    totals = [sum(e.get(k) or 0 for e in per_run.values()) / 3600 for k in columns]
    actual = sum(totals[:len(kinds) + 1])
    print(f"{'grid total (hours, not minutes)':<40} " + " ".join(f"{t:{w}.2f}" for t, w in zip(totals, widths))
          + f"   together {actual:.2f} hours" + (f", estimated {sum(totals[len(kinds) + 1:]):.2f}"
                                                  if any(totals[len(kinds) + 1:]) else ""))


def estimate_file(grid: Grid) -> Path:
    return Path(grid.out_dir) / grid.name / "_estimate.json"


def save_estimates(grid: Grid, estimates: dict[str, Estimate]) -> None:
    path = estimate_file(grid)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.is_file() else {}
    old.update({name: {"train_s": e.train_s, "eval_s": e.eval_s} for name, e in estimates.items() if not e.failed})
    write_text_atomic(path, json.dumps(old, indent=1))


def saved_estimates(grid: Grid) -> dict[str, dict]:
    path = estimate_file(grid)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}

