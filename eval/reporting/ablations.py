"""Which rows of a report are ablations: the settings a sweep did not choose.

A grid that is both a sweep and a study (`ropelab tune` chose each encoding's setting on
validation at L and wrote tuning.json into the grid's report directory) trains the settings it
did not choose too. They stay in the report, as ablations: in the tables of perplexity, but
compared with the reference in a table of their own, with a multiple-comparison correction of
their own, so that many also-ran settings neither crowd the study's figures nor weaken the
correction over the study's own comparisons.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ropelab.common.errors import DataError

TUNING = "tuning.json"


def sweep_choices(out: Path) -> Optional[dict[str, str]]:
    """{grid row: the row chosen for its encoding} from ``out``/tuning.json; None when there is
    no such file; a DataError (exit 2) when it is not one `ropelab tune` wrote."""
    path = Path(out) / TUNING
    if not path.is_file():
        return None
    try:
        encodings = json.loads(path.read_text(encoding="utf-8"))["encodings"]
        return {str(row): str(entry["chosen"]) for entry in encodings.values() for row in entry["rows"]}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DataError(f"{path} is not a sweep record that `ropelab tune` wrote ({type(e).__name__}: {e}); "
                        "make it again with `ropelab tune GRID` or move it away") from None


def sweep_ablations(out: Path, runs: list[dict]) -> Optional[dict[str, str]]:
    """{label of a row the sweep did not choose: label of the row it chose} for the runs of
    this report, from ``out``/tuning.json; None when there is no such file. Sweep rows the
    report does not hold are left out."""
    choices = sweep_choices(out)
    if choices is None:
        return None
    labels = {run["stem"]: run.get("label") or run["stem"] for run in runs if run.get("stem")}
    return {labels[row]: labels.get(chosen, chosen) for row, chosen in choices.items()
            if row != chosen and row in labels}


def base_label(label: str) -> str:
    """The row a label is of, without its RoPE scaling ("rope + yarn" is of "rope")."""
    return label.split(" + ", 1)[0]


def is_ablation(name: str, ablations: dict[str, str]) -> bool:
    """A row label, or a comparison "A vs B", that involves an ablation row."""
    return any(base_label(part) in ablations for part in name.split(" vs "))


def ablations_note(ablations: dict[str, str]) -> list[str]:
    """The report's sentence naming the ablations and the setting each lost to."""
    if not ablations:
        return []
    by_chosen: dict[str, list[str]] = {}
    for row, chosen in sorted(ablations.items()):
        by_chosen.setdefault(chosen, []).append(row)
    parts = [f"{', '.join(f'`{r}`' for r in rows)} (chosen instead: `{chosen}`)" for chosen, rows in by_chosen.items()]
    return ["", f"**Ablations.** The sweep beside this report ({TUNING}, tuning.md) chose one setting per "
            "encoding on validation loss at L; the settings it did not choose are ablations: "
            + "; ".join(parts) + ". They appear in the perplexity tables; their paired comparisons form a "
            "table and a multiple-comparison family of their own, and the figures draw the study's rows only. "
            "The sweep's seeds of each chosen row are among its seeds here, and they were chosen for the lowest "
            "validation loss at L: at L they may flatter the chosen setting a little (the winner's curse of any "
            "choice on the data that then measures it); the seeds added after the choice carry no such selection."]
