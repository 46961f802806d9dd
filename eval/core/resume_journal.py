"""A journal of an evaluation's finished cells, so an interrupted evaluation resumes.

eval/lm/extrapolation.py scores a run cell by cell: (checkpoint, corpus, scaling, length),
every protocol of it. Each finished cell is appended to a JSON-lines file beside the
run's evaluation cache (``extrapolation-KEY.partial.jsonl``); when the evaluation is
started again for the same checkpoint and config, the journal's cells are taken instead
of computed, and the journal is removed once the whole evaluation is cached.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ropelab.common.atomic import write_text_atomic


class Cells:
    """Finished (checkpoint, corpus, scaling, length) cells of one evaluation, appended to a
    journal as they finish so a run killed mid-evaluation (a session that ends, Ctrl-C)
    resumes after its last finished cell instead of from the start. The journal belongs to
    one checkpoint and one evaluation config (its file name carries the cache key); a
    journal left by another checkpoint is started afresh."""

    def __init__(self, path: Optional[Path] = None, checkpoint: Optional[str] = None):
        self.path, self.done, self.seconds = path, {}, 0.0
        self.checkpoint, self.started = checkpoint, False  # the journal is (re)started at its first cell
        if path is None:
            return
        lines = path.read_text().splitlines() if path.exists() else []
        head = _json_line(lines[0]) if lines else None
        if head is None or head.get("checkpoint") != checkpoint:
            return
        self.started = True
        for line in lines[1:]:
            cell = _json_line(line)  # a line cut short by a kill is simply done again
            if cell is not None:
                self.done[cell["cell"]] = cell
                self.seconds += cell["seconds"]

    def get(self, key: str) -> Optional[dict]:
        return self.done.get(key)

    def add(self, key: str, rows: list[dict], curve: Optional[dict], seconds: float) -> None:
        cell = {"cell": key, "rows": rows, "curve": curve, "seconds": round(seconds, 2)}
        self.done[key] = cell
        if self.path is not None:
            if not self.started:  # a fresh journal, or one left by another checkpoint: replaced now
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(self.path, json.dumps({"checkpoint": self.checkpoint}) + "\n")
                self.started = True
            with open(self.path, "a") as f:
                f.write(json.dumps(cell) + "\n")

    def discard(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def _json_line(line: str) -> Optional[dict]:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
