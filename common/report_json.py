"""The layout of a report's results.json: one line per cell.

A report's results.json (perplexity, task and diagnostics reports) is a dict whose large
values are lists of cells (one per run, length, protocol, scaling) or dicts keyed by run.
Written with ``indent=1`` every number of every per-document array took a line of its own,
and a study of 60 runs came to tens of MB. ``dumps_report`` writes each top-level key on a
line, and each element of a top-level list (or item of a top-level dict) compactly on a line
of its own: about 40% smaller than ``indent=1``, still valid JSON that ``json.load`` reads
unchanged, and a regenerated report's ``git diff`` shows which cells changed.
"""

from __future__ import annotations

import json

_COMPACT = {"separators": (",", ":"), "ensure_ascii": False}


def _key(key) -> str:
    """``key`` as JSON writes a dict's key (ints, floats, booleans and None become strings)."""
    return json.dumps({key: 0}, **_COMPACT)[1:-3]


def dumps_report(results: dict) -> str:
    """``results`` as JSON text, one line per top-level key and per element of its top-level
    lists and dicts; ``json.loads`` of the text equals ``results``."""
    if not isinstance(results, dict):
        return json.dumps(results, **_COMPACT) + "\n"
    items = []
    for key, value in results.items():
        head = _key(key) + ":"
        if isinstance(value, list) and value:
            body = ",\n".join(json.dumps(v, **_COMPACT) for v in value)
            items.append(f"{head}[\n{body}\n]")
        elif isinstance(value, dict) and value:
            body = ",\n".join(f"{_key(k)}:{json.dumps(v, **_COMPACT)}"
                              for k, v in value.items())
            items.append(f"{head}{{\n{body}\n}}")
        else:
            items.append(head + json.dumps(value, **_COMPACT))
    return "{\n" + ",\n".join(items) + "\n}\n"
