"""Make a report again from its results.json alone: ``ropelab regenerate DIR/results.json...``.

A report's results.json holds every number its tables and figures come from (per-unit sums
of every run and cell, per-position curves, the runs' training curves), so a change of
method — new intervals, a new section — is applied to a committed report without its runs
or any evaluation: the report is written again over itself (or into ``--out``). Perplexity,
task and attention diagnostics reports are told apart by their contents (a diagnostics
report's results.json keeps no example maps, nor does an early perplexity report's keep its
training curves: made again, the report links the figures drawn beside it, which ``--out``
copies along). ``--reference ROW`` changes the row a perplexity or task report compares every
other row with (a task table that has no such row says so). The numbers in results.json are
never edited (a diagnostics results.json that still keeps its runs' full cells, the first
format, is reduced to per-window measures as a new report would be); the report says when it
was made again. A results.json whose contents no report can be made from is a DataError.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional

from ropelab.common.cli import entry_point, usage_when_empty
from ropelab.common.errors import ArgumentError, DataError
from ropelab.common.logs import get_logger
from ropelab.eval.diagnostics.report import kept_results, pooled_rows, write_diagnostics_report
from ropelab.eval.reporting.reference import missing_reference
from ropelab.eval.reporting.report_dir import DIAGNOSTICS, TASKS, report_kind
from ropelab.eval.lm.report import write_report
from ropelab.eval.tasks.compare import missing_task_reference
from ropelab.eval.tasks.report import write_task_report

logger = get_logger(__name__)


def read_results(path: Path) -> dict:
    """A report's results.json, or a DataError saying what is wrong with it."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path} does not exist; give a report's results.json (or its directory)") from None
    except (OSError, ValueError) as e:
        raise DataError(f"{path} cannot be read as a report's results.json ({e})") from None
    kind = report_kind(results)
    if kind is None or not isinstance(results.get("runs"), list) or (
            kind == DIAGNOSTICS and not isinstance(results.get("cells"), dict)):
        raise DataError(f"{path} is not a report's results.json (it has no runs and results, or runs and cells)")
    return results


def remake(path: Path, out: Optional[Path] = None, reference: Optional[str] = None) -> Path:
    """Write the report of ``path`` (a results.json) into ``out`` (default: its own directory)."""
    results = read_results(path)
    source = Path(path) if Path(path).is_dir() else Path(path).parent
    out = Path(out) if out is not None else source
    results["remade"] = time.strftime("%Y-%m-%d %H:%M:%S")
    kind = report_kind(results)
    if kind == DIAGNOSTICS:  # an attention diagnostics report (eval/diagnostics/measure.py)
        if reference is not None:
            raise ArgumentError("--reference applies to perplexity reports; this is a diagnostics report")
        try:  # read and pool the cells before anything is written
            pooled_rows(kept_results(results))
        except (KeyError, TypeError, ValueError, IndexError) as e:  # numpy's AxisError is both of the last two
            raise DataError(f"{path} looks like a diagnostics report's results.json but its cells cannot be "
                            f"read ({type(e).__name__}: {e}); make the report again from its runs with "
                            "`ropelab diagnose`") from None
        # results.json keeps no maps
        write_diagnostics_report(results, out, carried_figures(source, out, ("attention_map_*.png",)))
        return out
    if reference is not None:  # as each run's eval.reference, where a fresh report reads it
        for run in results["runs"]:
            run["eval"] = {**(run.get("eval") or {}), "reference": reference}
    if kind == TASKS:  # a task report (eval/tasks/exact_match.py): each task's table names its rows itself
        write_task_report(results, out)
        missing = missing_task_reference(results)
        if missing:
            logger.warning(f"warning: {missing}")
        return out
    # An early results.json keeps no training curves: they are only in the figure.
    write_report(results, out, () if results.get("training_curves") else
                 carried_figures(source, out, ("training_loss.png",)))
    missing = missing_reference(results)
    if missing:
        logger.warning(f"warning: {missing}")
    return out


def carried_figures(source: Path, out: Path, patterns: tuple[str, ...]) -> tuple[Path, ...]:
    """The figures that results.json cannot draw again (``patterns``, globbed in the report's own
    directory ``source``), for the report made in ``out`` to link as the original does; none
    when ``out`` is ``source``."""
    if out.exists() and out.resolve() == source.resolve():
        return ()
    return tuple(sorted(f for pattern in patterns for f in source.glob(pattern) if f.is_file()))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ropelab regenerate", description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", type=Path, help="results.json files of reports (or their directories)")
    p.add_argument("--out", type=Path, help="where to write the report (one results.json only; default: beside it)")
    p.add_argument("--reference", metavar="ROW",
                   help="the row every other row is compared with (perplexity and task reports)")
    usage_when_empty(p, argv)
    return p.parse_args(argv)


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.out is not None and len(args.results) > 1:
        raise ArgumentError("--out takes one results.json; drop it to write each report beside its results.json")
    for path in args.results:
        logger.info(f"wrote {remake(path, args.out, args.reference) / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
