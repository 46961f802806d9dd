"""How rows of results are named in tables and plots (shared by report.py and plots.py)."""

from __future__ import annotations

import re

from ropelab.model.encodings import report_label


def encoding_label(encoding: str, attention: str = "softmax") -> str:
    """``rope``, ``nope``…; a run with another attention kind than softmax says so."""
    label = report_label(encoding)
    return label if attention == "softmax" else f"{label} ({attention} attention)"


# "linear" scaling is Position Interpolation (Chen et al. 2023); the name alone reads like
# linear attention next to rows such as "rope (linear attention)".
SCALING_NAMES = {"linear": "linear (PI)"}


def with_scaling(label: str, scaling: str) -> str:
    return label if scaling == "none" else f"{label} + {SCALING_NAMES.get(scaling, scaling)}"


def row_label(row: dict) -> str:
    """A table row: the run's group label (encoding, made unique per config) + scaling."""
    return with_scaling(row.get("label") or encoding_label(row["encoding"]), row["scaling"])


def label_encodings(results: dict) -> dict[str, str]:
    """Each row label of a report's results (and each run's label) -> its encoding (``pos.kind``,
    or a layer plan's name), so a figure colours the row as every other figure does."""
    out = {run.get("label") or run["name"]: run["encoding"] for run in results.get("runs", []) if "encoding" in run}
    for row in results.get("results", []):
        if "encoding" in row:
            out.setdefault(row_label(row), row["encoding"])
    return out


PLAN_LEGEND = ("are layer plans: each layer type of the plan in pattern order, as "
               "its encoding with what the type changes (θ: its RoPE base; a RoPE scaling it trains with, "
               "e.g. linear×8; w: its sliding window in tokens; sinks; a temperature), separated by /, "
               "then the pattern of type letters that repeats over the "
               "layers (docs/encodings.md, \"Layers that differ\")")


def plan_rows(labels) -> list[str]:
    """The labels among ``labels`` that name a layer plan (``rope·w64/none [SSSN]``)."""
    return [label for label in labels if re.search(r" \[[A-Za-z]+\]( \+ \S.*)?$", split_step(label)[0])]


def plan_note(labels) -> str:
    """A sentence for a summary whose rows include a layer plan (else ""): how its name reads."""
    plans = plan_rows(labels)
    return "" if not plans else f" Rows such as `{plans[0]}` {PLAN_LEGEND}."


def split_step(label: str) -> tuple[str, "int | None"]:
    """("ROW", STEP) for a budget row "ROW @ STEP" (a checkpoint of a fine-tune, eval.steps),
    else (label, None). A scaling suffix stays with the row: "ROW + yarn @ 50" is not made."""
    row, sep, step = label.rpartition(" @ ")
    head, plus, scaling = step.partition(" + ")
    if not sep or not head.isdigit():
        return label, None
    return row + (f" + {scaling}" if plus else ""), int(head)


def budget_partner(label: str, reference: str) -> str:
    """The row ``label`` is compared with: the reference; in a budget grid (reference "ROW @
    STEP"), the reference row after as many steps, and the reference row's own checkpoints
    (and rows without steps) the reference itself."""
    ref_row, ref_step = split_step(reference)
    if ref_step is None:
        return reference
    row, step = split_step(label)
    return reference if row == ref_row or step is None else f"{ref_row} @ {step}"


def label_order(label: str) -> tuple[str, int]:
    """Sort key: rows by name, a fine-tune's checkpoints by step (0, 50, 100 … not 0, 100, 50)."""
    row, step = split_step(label)
    return row, -1 if step is None else step


def label_groups(runs: list[dict], rows: list[dict]) -> None:
    """Label rows by encoding and attention kind; where one such pair has several configs, by
    the run-name stem."""
    # Evaluations cached before attention kinds existed are softmax runs.
    kinds = {run["run"]: encoding_label(run["encoding"], run.get("attention", "softmax")) for run in runs}
    groups_per_kind: dict[str, set] = {}
    for run in runs:
        groups_per_kind.setdefault(kinds[run["run"]], set()).add(run["group"])
    label = {}
    for run in runs:
        kind = kinds[run["run"]]
        label[run["run"]] = kind if len(groups_per_kind[kind]) == 1 else run["stem"].removeprefix("kind-")
        run["label"] = label[run["run"]]
    for row in rows:  # a checkpoint of a budget curve (eval.steps) is a row of its own
        row["label"] = label[row["run"]] + (f" @ {row['eval_step']}" if "eval_step" in row else "")


def replicate_unit(run: dict) -> str:
    """The independent replicate a run belongs to (eval/reporting/stats.py, "Fine-tunes of several
    parents"): a fine-tune's parent run and checkpoint, else the run itself."""
    parent = run.get("parent")
    return f"{parent['run']}@{parent.get('checkpoint')}" if parent else run["run"]


def replicate_units(runs: list[dict]) -> dict[str, str]:
    """run -> its replicate unit, for the runs of a results.json."""
    return {run["run"]: replicate_unit(run) for run in runs}


def units_of(units: dict[str, str] | None, runs) -> tuple[str, ...]:
    """Each of ``runs``' replicate unit from a ``replicate_units`` map, in order (a run it
    lacks is its own unit); () without a map."""
    return tuple(units.get(run, run) for run in runs) if units else ()


def parents_note(runs: list[dict]) -> list[str]:
    """A report's paragraph on fine-tunes of several parents (none where there are not)."""
    parents = {replicate_unit(run) for run in runs if run.get("parent")}
    if len(parents) < 2:
        return []
    return ["", f"The fine-tunes start from {len(parents)} parents. A row's fine-tunes of one parent share its weights, "
            "so they are averaged within that parent first: its interval across training runs, and its power, are "
            "over the parents, not the fine-tunes (eval/reporting/stats.py, \"Fine-tunes of several parents\")."]
