"""Choose each encoding's setting from a finished sweep grid, on validation at the training
length, the engine behind ``ropelab tune GRID [--out DIR]`` (scripts/tune.py).

A sweep grid trains every encoding under a few settings (its rows: for example
``train.pos_lr_multiplier`` 1, 3, 10 and 30 for a learned bias, or FIRE's threshold
initialised at L) with the same seeds. Tuning uses the runs' own validation loss at L (the
last ``val_loss`` in each run's metrics.jsonl: the run's fixed validation windows, at the
training length), never the extrapolation lengths a study then compares, so the choice
does not favour the lengths it is judged on.

For each encoding (``model.pos.kind``, with the attention kind when it is not softmax) the
report gives every row's mean validation loss over its seeds with a t-interval, chooses the
row with the lowest mean, and sets every other row against it by seed (a paired
t-interval, df = seeds − 1): a row whose interval excludes 0 is worse across training runs;
one whose interval includes 0 is "undecided at N seeds", and the choice between them is the
lower mean and no more. A choice at the end of a numeric range swept (the largest learning
rate tried, say) is flagged: the best value may lie beyond it, and the sweep should grow.
The chosen rows' overrides are printed as variant lines for a study grid, and the whole sweep
is kept in ``DIR/tuning.md`` and ``DIR/tuning.json`` (default: the grid's report directory),
which a study that uses the choice cites.

A study may also grow the sweep grid itself: ``--more-seeds 2 3 4`` prints a ``more_seeds``
block that adds those seeds to every chosen row, and the rows not chosen stay in its report
as ablations at the sweep's seeds. The choice is always made on the sweep's seeds (the
grid's ``train.seed`` axis), so seeds added later never change it.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Optional

from ropelab.common.errors import DataError
from ropelab.configs.experiment import experiment_identity
from ropelab.configs.grid import Grid, PlannedRun, row_of
from ropelab.eval.reporting.intervals import t_interval
from ropelab.grid.run_state import status
from ropelab.grid.archive import restore_records
from ropelab.training.run_dir import RunDir


def encoding_of(run: PlannedRun) -> str:
    m = run.cfg.model
    return m.pos.kind if m.attention == "softmax" else f"{m.attention}+{m.pos.kind}"


def final_val_loss(run: PlannedRun) -> float:
    """The last validation loss the run logged (at its final step, for a finished run)."""
    path = RunDir.of(run.cfg).metrics
    found: Optional[tuple[int, float]] = None
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise DataError(f"{path}: cannot read the run's metrics ({e})") from None
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill; the others stand
        if "val_loss" in entry and (found is None or entry["step"] >= found[0]):
            found = (entry["step"], float(entry["val_loss"]))
    if found is None or not math.isfinite(found[1]):
        raise DataError(f"{path}: no finite validation loss; the run must validate (train.eval_interval) to be tuned")
    return found[1]


def row_settings(grid: Grid, rows: list[str]) -> dict[str, list[str]]:
    """Each row's overrides that set it apart (its variant's, or its axis values)."""
    return {row: list(grid.variants.get(row, [])) or [row] for row in rows}


def sweep_seeds(grid: Grid, planned: list[PlannedRun]) -> set[int]:
    """The seeds the choice is made on: the grid's train.seed axis, never seeds added to chosen
    rows afterwards (more_seeds), which would weigh the chosen row on more runs."""
    return set(grid.axes.get("train.seed") or [r.cfg.train.seed for r in planned])


def tune(grid: Grid) -> dict:
    """Per encoding: every row's validation losses by seed, the chosen row, the contrasts."""
    planned = grid.plan()
    seeds = sweep_seeds(grid, planned)
    runs = [r for r in planned if r.cfg.train.seed in seeds]
    restore_records(grid, runs)  # runs kept in the grid's archive count (grid/archive.py)
    pending = [r.name for r in runs if status(r)[0] != "done"]
    if pending:
        raise DataError(f"{len(pending)} of the grid's {len(runs)} runs are not finished ({', '.join(pending[:4])}"
                        f"{', …' if len(pending) > 4 else ''}); run ropelab ablate {grid.source} first")
    losses: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    identities: dict[str, dict] = {}  # each row's experiment, seed aside
    for run in runs:
        losses[encoding_of(run)][row_of(run.name)][run.cfg.train.seed] = final_val_loss(run)
        identities.setdefault(row_of(run.name), experiment_identity(run.cfg, ignore=("train.seed",)))
    settings = row_settings(grid, [row for rows in losses.values() for row in rows])
    encodings = {}
    for encoding, rows in losses.items():
        summary = {}
        for row, by_seed in rows.items():
            mean, low, high = t_interval(list(by_seed.values()))
            summary[row] = {"seeds": sorted(by_seed), "val_loss": by_seed, "mean": float(mean),
                            "low": None if low is None else float(low), "high": None if high is None else float(high),
                            "overrides": settings[row]}
        chosen = min(summary, key=lambda row: summary[row]["mean"])
        for row, entry in summary.items():
            if row == chosen:
                continue
            shared = sorted(set(entry["val_loss"]) & set(summary[chosen]["val_loss"]))
            diffs = [entry["val_loss"][s] - summary[chosen]["val_loss"][s] for s in shared]
            mean, low, high = t_interval(diffs) if diffs else (math.nan, None, None)
            entry["vs_chosen"] = {"seeds": len(diffs), "mean": float(mean),
                                  "low": None if low is None else float(low),
                                  "high": None if high is None else float(high),
                                  "verdict": verdict(low, len(diffs))}
        encodings[encoding] = {"chosen": chosen, "rows": summary,
                               "edges": sweep_edges(chosen, {row: identities[row] for row in summary})}
    return {"grid": grid.name, "source": str(grid.source), "seeds": sorted(seeds),
            "added_later": len(planned) - len(runs), "encodings": encodings}


def more_seeds_block(grid: Grid, found: dict, seeds: list[int]) -> dict[str, list[int]]:
    """The grid's more_seeds with ``seeds`` added to every chosen row: rows that already have
    added seeds (a study's fixed rows given their seeds while the sweep trained) keep them and
    gain only the ones they lack, so the block pasted over the grid's own names no seed twice."""
    block = {row: list(added) for row, added in grid.more_seeds.items()}
    for entry in found["encodings"].values():
        have = block.setdefault(entry["chosen"], [])
        have += [seed for seed in seeds if seed not in have]
    return block


def sweep_edges(chosen: str, identities: dict[str, dict]) -> list[str]:
    """Each numeric setting at which the chosen row sits at the end of the range swept (three
    values or more), among the rows that differ from it in that setting alone
    (``train.pos_lr_multiplier`` 30 of 1, 10, 30): the best value may lie beyond it, so the
    sweep should be extended before a study relies on the choice."""
    mine = identities[chosen]
    differs = {row: {k for k in set(ident) | set(mine) if ident.get(k) != mine.get(k)}
               for row, ident in identities.items()}
    edges = []
    for key in sorted(set().union(*differs.values())):
        values = [identities[row].get(key) for row, keys in differs.items() if keys <= {key}]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        # Two settings are a comparison, not a range.
        if len(set(values)) < 3 or not numeric or mine.get(key) not in (min(values), max(values)):
            continue
        end = "largest" if mine.get(key) == max(values) else "smallest"
        edges.append(f"{key} = {mine.get(key):g} is the {end} value swept "
                     f"({', '.join(f'{v:g}' for v in sorted(set(values)))}): a value beyond it may do better; "
                     "extend the sweep before a study relies on the choice")
    return edges


def verdict(low: Optional[float], seeds: int) -> str:
    if low is None:
        return f"undecided at {seeds} seed{'s' if seeds != 1 else ''} (no interval)"
    return "worse across training runs" if low > 0 else f"undecided at {seeds} seeds"


def _interval(entry: dict, digits: int = 4) -> str:
    if entry["low"] is None:
        return f"{entry['mean']:.{digits}f}"
    return f"{entry['mean']:.{digits}f} ({entry['low']:.{digits}f} to {entry['high']:.{digits}f})"


def report_text(found: dict) -> str:
    lines = [f"# Tuning: {found['grid']}", "",
             f"From `ropelab tune {found['source']}`. Validation loss at the training length (each run's "
             "last validation, nats per token), mean over seeds with a 95% t-interval; each row against the chosen "
             "one paired by seed (t-interval, df = seeds − 1). The chosen row has the lowest mean; a row whose "
             "interval against it includes 0 is undecided at that many seeds."
             + (f" Seeds {', '.join(map(str, found['seeds']))} only: the {found['added_later']} runs added to rows "
                "later (more_seeds) do not change the choice." if found["added_later"] else ""), ""]
    single = [e for e, entry in found["encodings"].items() if len(entry["rows"]) == 1]
    if single:
        lines += ["Not swept (one row each): " + ", ".join(f"{e} ({found['encodings'][e]['chosen']})" for e in single)
                  + ".", ""]
    for encoding, entry in found["encodings"].items():
        if encoding in single:
            continue
        lines += [f"## {encoding}: {entry['chosen']}", ""]
        lines += [f"Chosen at the edge of the sweep: {edge}." for edge in entry.get("edges", [])]
        lines += [""] if entry.get("edges") else []
        lines += ["| row | overrides | seeds | validation loss | against the chosen row | |",
                  "|---|---|---|---|---|---|"]
        for row, r in sorted(entry["rows"].items(), key=lambda kv: kv[1]["mean"]):
            against = r.get("vs_chosen")
            lines.append(f"| {row}{' (chosen)' if row == entry['chosen'] else ''} | {' '.join(r['overrides'])} | "
                         f"{len(r['seeds'])} | {_interval(r)} | "
                         f"{'–' if against is None else ('%+.4f' % against['mean']) + ('' if against['low'] is None else ' (%+.4f to %+.4f)' % (against['low'], against['high']))} | "
                         f"{'' if against is None else against['verdict']} |")
        lines.append("")
    return "\n".join(lines)
