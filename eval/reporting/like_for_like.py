"""Whether the rows a report compares were trained alike, apart from what the report compares.

A report sets each row against its reference row: the difference is read as the difference
between their encodings (or whatever names the rows). Rows trained for other budgets, at
other shapes or on other data differ in those too, and the comparison measures them all at
once (the README's first comparison once set RoPE trained 600 steps against ALiBi trained
200). Each run's metadata keeps its steps and tokens trained and its ``setup``
(``run_setup``: the model's shape and the data it trained on, as the experiment identity
of configs/experiment.py has them); ``unlike_note`` names what differs above the
comparisons. Rows trained on other data (another tokenizer or corpus) are never scored on
the same tokens, so they are not paired at all; the note says why. Fine-tunes are compared
with where they started by design (their parents' note says so), and are left out here.
"""

from __future__ import annotations

from typing import Iterable

from ropelab.configs.experiment import experiment_identity
from ropelab.configs.schema import RunConfig
from ropelab.eval.reporting.labels import label_order, row_label, split_step
from ropelab.eval.reporting.reference import report_reference

# The keys of the model's shape: what "the same model" means beside its encoding.
SHAPE_KEYS = ("model.d_model", "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.ffn_hidden",
              "model.multiple_of", "model.tie_embeddings", "model.attention")


def run_setup(cfg: RunConfig) -> dict[str, dict]:
    """The shape and data a run trained with, as its report's metadata keeps them."""
    identity = experiment_identity(cfg)
    return {"shape": {key: identity.get(key) for key in SHAPE_KEYS},
            "data": {key: value for key, value in identity.items() if key.startswith("data.")}}


def _budget(run: dict) -> "int | None":
    """The steps a run was planned for (its schedule), else the steps it took: a run stopped once
    competent (train.stop_at_accuracy) trained to the same budget as its row however early it stopped."""
    return run.get("total_steps") or run.get("steps")


def _values(runs: list[dict], read) -> str:
    found = sorted({read(run) for run in runs if read(run) is not None})
    return "/".join(f"{value:,}" for value in found) or "?"


def _setting(runs: list[dict], part: str, key: str) -> str:
    values = {str((run.get("setup") or {}).get(part, {}).get(key)) for run in runs}
    return "/".join(sorted(values))


def _named(key: str, labels: tuple[str, ...]) -> bool:
    """Whether the rows' labels name ``key`` (a grid axis: ``d_model-64``), so it is the setting compared."""
    return any(f"{key.split('.')[-1]}-" in label for label in labels)


def differences(runs: list[dict], reference: list[dict], labels: tuple[str, ...] = ()) -> list[str]:
    """What two rows' runs (``runs`` against ``reference``) differ in besides the row's own setting:
    steps, tokens trained, shape and data, each with both values; keys the rows' ``labels`` name
    (a grid axis) are the setting compared."""
    out = []
    both = (*runs, *reference)
    # A competence stop ends each seed at its own step: its tokens differ by design, its budget does not.
    reads = [("max_steps", "steps", _budget)]
    if not any(run.get("competence") for run in both):
        reads.append(("max_tokens", "tokens trained", lambda run: run.get("tokens_trained")))
    for key, what, read in reads:
        mine, theirs = _values(runs, read), _values(reference, read)
        if mine != theirs and not _named(key, labels):
            out.append(f"{what} ({mine} against {theirs})")
    for part in ("shape", "data"):
        if not all(run.get("setup") for run in both):
            continue  # evaluated before runs recorded their setup
        keys = sorted({k for run in both for k in run["setup"].get(part, {})})
        changed = [f"{key} {_setting(runs, part, key)} against {_setting(reference, part, key)}" for key in keys
                   if _setting(runs, part, key) != _setting(reference, part, key) and not _named(key, labels)]
        if changed:
            out.append(f"{part} ({'; '.join(changed[:3])}{'; …' if len(changed) > 3 else ''})")
    return out


def unlike_note(rows: dict[str, list[dict]], reference: str, compared: Iterable[str]) -> str:
    """A paragraph naming, for each row of ``compared`` set against ``reference`` (``rows``: label
    -> the metadata of its runs), what it differs in beyond its own setting; "" when all are alike."""
    found = []
    for label in compared:
        runs, theirs = rows.get(label) or [], rows.get(reference) or []
        if label == reference or not runs or not theirs or any(run.get("parent") for run in (*runs, *theirs)):
            continue
        differ = differences(runs, theirs, (label, reference))
        if differ:
            found.append(f"`{label}` against `{reference}`: {', '.join(differ)}")
    if not found:
        return ""
    data = any("data (" in line for line in found)
    return ("**Not like for like**: these rows differ in more than the setting they compare, so each comparison "
            f"below measures that too: {'; '.join(found)}. Train them alike (the same train.max_steps or "
            "train.max_tokens, shape and data) to compare the settings alone."
            + (" Rows trained on other data are never scored on the same tokens, so they are not paired." if data
               else ""))


def unlike_rows(results: dict) -> str:
    """``unlike_note`` for a perplexity report's results (each row against its reference row);
    "" in a budget grid, whose rows are fine-tunes paired by step."""
    reference, _ = report_reference(results)
    if split_step(reference)[1] is not None:
        return ""
    runs = {run["run"]: run for run in results["runs"]}
    rows: dict[str, dict[str, dict]] = {}
    for row in results["results"]:
        if row.get("run") in runs:
            rows.setdefault(row_label(row), {})[row["run"]] = runs[row["run"]]
    return unlike_note({label: list(found.values()) for label, found in rows.items()}, reference,
                       sorted(rows, key=label_order))
