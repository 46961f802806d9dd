"""The row a report compares every other row with (eval.reference), and why, when it is not
the one the config names."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ropelab.configs.schema import EvalConfig
from ropelab.eval.reporting.labels import row_label


DEFAULT_REFERENCE = EvalConfig().reference  # "rope"


def _started_from(run: dict, parent: dict) -> bool:
    """Whether ``run`` is the run that ``parent`` (a fine-tune's init.run record) names: the same
    directory, or one of the same name and training length (the runs moved or copied since)."""
    if Path(run["run"]).resolve() == Path(parent["run"]).resolve():
        return True
    return Path(run["run"]).name == Path(parent["run"]).name and run["train_len"] == parent.get("train_len")


def parent_rows(runs: list[dict]) -> set[str]:
    """The rows holding a run that another run of the report was fine-tuned from (init.run)."""
    parents = [run["parent"] for run in runs if run.get("parent")]
    return {run["label"] for run in runs if run.get("label") and any(_started_from(run, p) for p in parents)}


def report_reference(results: dict) -> tuple[str, str]:
    """(the row the report compares every other row with, a sentence saying why when eval.reference
    did not name it).

    It is eval.reference. Left at its default, ``rope``, where no row is called that (rows are
    named after runs when one encoding has several experiments, e.g. a fine-tune beside its
    parent), it is the one row whose runs other runs of the report were fine-tuned from
    (init.run): fine-tunes are compared with where they started. Where no single row is such a
    parent, there is no reference and the report says so.
    """
    runs = results["runs"]
    asked = runs[0]["eval"].get("reference", DEFAULT_REFERENCE) if runs else DEFAULT_REFERENCE
    labels = {row_label(row) for row in results["results"]}
    parents = sorted(parent_rows(runs) & labels)
    if asked in labels or asked != DEFAULT_REFERENCE or len(parents) != 1:
        return asked, ""
    return parents[0], (f"Reference row: `{parents[0]}`. eval.reference is left at `{asked}`, which names no row "
                        f"here, and `{parents[0]}` is the one row that other runs of this report were fine-tuned "
                        "from (init.run), so every row is compared with it; name another with `--reference ROW`.")


def no_default_reference(results: dict) -> str:
    """Why the default reference stood in for no row, when it is the default."""
    runs = results["runs"]
    if not runs or runs[0]["eval"].get("reference", DEFAULT_REFERENCE) != DEFAULT_REFERENCE:
        return ""
    parents = sorted(parent_rows(runs))
    return (", and no single row is the one the others were fine-tuned from (init.run), which would stand in "
            "for it" + (f"; parents: {', '.join(f'`{p}`' for p in parents)}" if parents else ""))


def missing_reference(results: dict) -> Optional[str]:
    """Why the report has no paired comparisons, when its reference row is none of its rows."""
    reference, _ = report_reference(results)
    labels = sorted({row_label(row) for row in results["results"]})
    if not results["runs"] or reference in labels:
        return None
    return (f"the reference row {reference!r} (eval.reference, --reference) is none of the report's rows, so it "
            f"has no paired comparisons; rows: {', '.join(labels)}. Rerun with --reference ROW: the evaluations "
            "are cached, so only the report is made again.")
