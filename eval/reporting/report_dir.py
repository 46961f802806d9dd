"""Which tool wrote a report, and where a new report may go.

Three kinds of report are written into a directory of their own: report.md, results.json
and figures. Each replaces an earlier report of its own kind only: over another kind's it
would leave that report's figures (and, where its figures are named alike, a mix of both)
under the new report.md. A report says its kind in its results.json: a task report's has
``kmax``, a diagnostics report's ``cells``, a perplexity report's ``results`` and neither
of those (``report_kind``; ``ropelab regenerate`` tells them apart the same way). A grid's
report directory holds its perplexity report, ``ropelab tune``'s sweep record beside it,
and the other two kinds' reports in ``tasks/`` and ``diagnostics/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ropelab.common.cli import check_output_dir
from ropelab.common.errors import ArgumentError
from ropelab.eval.reporting.ablations import sweep_choices
from ropelab.training.run_dir import RunDir


@dataclass(frozen=True)
class ReportKind:
    name: str  # as messages name it: "a perplexity report"
    tool: str  # the command that writes it
    marker: str  # the results.json key that only this kind has (checked in the order of KINDS)
    title: str  # the first line of its report.md


KINDS = (ReportKind("task", "ropelab tasks", "kmax", "# Task accuracy report"),
         ReportKind("diagnostics", "ropelab diagnose", "cells", "# Attention diagnostics"),
         ReportKind("perplexity", "ropelab eval", "results", "# Length extrapolation report"))
BY_NAME = {kind.name: kind for kind in KINDS}
PERPLEXITY, TASKS, DIAGNOSTICS = BY_NAME["perplexity"], BY_NAME["task"], BY_NAME["diagnostics"]
# What else a grid's report directory holds beside its perplexity report, and may hold
# before the first one: grid/tune.py's sweep record and the other kinds' reports.
GRID_COMPANIONS = ("tuning.md", "tuning.json", "tasks", "diagnostics")


def report_kind(results: dict) -> Optional[ReportKind]:
    """The kind of report a results.json (as read) belongs to; None for none of them."""
    return next((kind for kind in KINDS if kind.marker in results), None) if isinstance(results, dict) else None


def _found(out: Path) -> Optional[ReportKind | bool]:
    """The kind of the report in ``out``; None when there is none; True for a report of no kind
    known (one written before results.json said it, or a report.md of another title): as
    before kinds were told apart, it is an earlier report, which is replaced."""
    results, markdown = out / "results.json", out / "report.md"
    if not results.is_file() and not markdown.is_file():
        return None
    try:
        found = report_kind(json.loads(results.read_text(encoding="utf-8"))) if results.is_file() else None
    except (OSError, UnicodeDecodeError, ValueError):
        found = None
    if found is None and markdown.is_file():
        with open(markdown, encoding="utf-8", errors="replace") as f:
            first = f.readline().strip()
        found = next((kind for kind in KINDS if kind.title == first), None)
    return found or True


def check_report_dir(out: Path, kind: ReportKind, tool: Optional[str] = None) -> None:
    """Refuse ``out`` before any work when a ``kind`` report cannot go there: a file; a run
    directory; another kind's report (named with the tool that wrote it); or, with no report
    there, other things than (in a perplexity report's directory) a grid's companions.
    ``tool``: a command writing a record that goes where a ``kind`` report goes, without
    replacing it (``ropelab tune``'s sweep record beside a grid's perplexity report)."""
    out = Path(out)
    check_output_dir(out, "--out")
    if not out.is_dir():
        return
    writer = tool or kind.tool
    if RunDir(out).config.is_file():
        raise ArgumentError(f"--out {out} is a run directory (it holds {RunDir(out).config.name}); `{writer}` "
                            "writes into a directory of its own: give a new one, e.g. reports/NAME (nothing was done)")
    found = _found(out)
    if isinstance(found, ReportKind) and found != kind:
        raise ArgumentError(f"--out {out} holds a {found.name} report, written by `{found.tool}`; `{writer}` "
                            f"{'writes beside' if tool else 'replaces'} only a {kind.name} report, so that one "
                            "would be left mixed with what it writes: give another directory (nothing was done)")
    companions = GRID_COMPANIONS if kind == PERPLEXITY else ()
    if found is None and any(entry.name not in companions for entry in out.iterdir()):
        raise ArgumentError(f"--out {out} already holds files that are not a report; give a new directory "
                            f"(an earlier {kind.name} report's directory is replaced) — nothing was done")
    if kind == PERPLEXITY and tool is None:  # the report reads the sweep record beside it: said before any work
        sweep_choices(out)
