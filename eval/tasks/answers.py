"""What the wrong answers were, where a task's answer is one of several candidates the
prompt holds (``Task.picks``: passkey among distractors, multikey, vartrack).

Exact match says that an instance failed, and where the first error falls
(eval/tasks/first_error.py) whether it failed from the answer's first token; neither says
whether the model retrieved the wrong candidate or none. Evaluation decodes each wrong
answer greedily, given the true text before it (training/exact_match.py: ``wrong_answers``),
and looks for what it wrote earlier in the prompt (data/tasks/base.py: ``answer_source``).
The report gives, per row and length, pooled over the seeds that learned the task (or
every seed where none did, marked):

- **seeds**: of those seeds, how many have cells that kept what they wrote; cells scored
  before evaluation kept the wrong answers hold none, and their seeds are left out of the
  row (a grid's records scored before then, whose weights are gone, cannot be scored again);
- **wrong**: the instances answered wrong, of those scored;
- **copied another candidate**: the share of the wrong answers written verbatim somewhere
  earlier in the prompt, with its 95% interval across training runs and instances
  (eval/reporting/stats.py: ``pooled_accuracy_interval`` over each run's wrong answers). Candidates
  are numbers of 5 digits or more, so a garbled answer is almost never one by accident;
  the rest of the wrong answers are nowhere in the prompt (a mix of candidates' digits, or
  a right start then a wrong copy);
- **of those, nearer the question**: the share of the copied ones that sit after the asked
  needle in the text, so nearer the question than it, against what a random pick of a
  wrong candidate would give where the task lays its other candidates uniformly into the
  filler and the asked one at a depth d (passkey's distractors, multikey's other needles):
  each wrong candidate lies after the needle with probability 1 − d, averaged over the
  copied answers' depths. A model whose reach ends short of a far needle and answers with
  a number it still sees shows a share near 1 at depths where the baseline is lower.

Below it, a few examples per row and length (cells that kept what was written): the first
wrong answers of the row's first seed, in depth order, the asked answer against the one
written.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np

from ropelab.eval.reporting.labels import label_order, units_of
from ropelab.eval.reporting.stats import pooled_accuracy_interval
from ropelab.eval.tasks.first_error import Kept, learned_or_every


def tally(per_run: dict[str, dict[int, list[dict]]], length: int) -> Optional[dict]:
    """One row's wrong answers at ``length``: per run [scored, wrong, copied, nearer], the
    random-pick baseline's sum over the copied answers, and how many runs were scored there at
    all (``pooled``; those whose cells checked nothing are not in ``runs``); None without cells
    that checked them."""
    runs: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    baseline, depths, pooled = 0.0, True, 0
    for run, by_length in per_run.items():
        ok = [c for c in by_length.get(length, []) if c.get("status") == "ok"]
        pooled += bool(ok)
        for c in ok:
            if "copied" not in c:
                continue
            counts = runs[run]
            counts[0] += c["total"]
            for first, answer, source in zip(c["first_error"], c["answer_tokens"], c["copied"]):
                if first >= answer:
                    continue
                counts[1] += 1
                if source is None:
                    continue
                copied_back, needle_back = source
                counts[2] += 1
                counts[3] += copied_back < needle_back
                if c.get("depth") is None:
                    depths = False
                else:
                    baseline += 1.0 - c["depth"]
    if not runs:
        return None
    return {"runs": dict(runs), "baseline": baseline if depths else None, "pooled": pooled}


def examples(per_run: dict[str, dict[int, list[dict]]], length: int, count: int = 3) -> list[tuple[str, str]]:
    """Up to ``count`` (asked, written) answers at ``length``: the first wrong ones of the
    first run (by name) whose cells kept them, in the order of its cells (depth order)."""
    for run in sorted(per_run):
        found = [tuple(pair) for c in per_run[run].get(length, []) if c.get("status") == "ok"
                 for pair in c.get("wrote") or [] if pair is not None]
        if found:
            return found[:count]
    return []


def _share(counts: list[tuple[int, int]], units: tuple[str, ...]) -> str:
    """``hit / total`` pooled over the runs that had any, with its interval; "–" where none had."""
    has = [i for i, (_, n) in enumerate(counts) if n]
    if not has:
        return "–"
    kept = [counts[i] for i in has]
    hit, total = map(sum, zip(*kept))
    low, high = pooled_accuracy_interval(kept, tuple(units[i] for i in has) if units else ())
    return f"{hit / total:.2f} [{low:.2f}, {high:.2f}] ({hit}/{total})"


def answers_section(task: str, kept: Kept, everyone: Kept, units: Optional[dict[str, str]] = None) -> list[str]:
    """The report's table of what the wrong answers were for one task (nothing where no cell
    checked them: tasks without candidates, or cells scored before the check existed)."""
    shown = learned_or_every(kept, everyone)
    lines, shown_examples = [], []
    for label in sorted(shown, key=label_order):
        name, per_run = shown[label]
        for length in sorted({n for by_length in per_run.values() for n in by_length}):
            t = tally(per_run, length)
            if t is None:
                continue
            pairs = examples(per_run, length)
            if pairs:
                shown_examples.append(f"| {name} | {length} | "
                                      + "; ".join(f"`{asked}` → `{wrote}`" for asked, wrote in pairs) + " |")
            runs = sorted(t["runs"])
            counts = np.array([t["runs"][r] for r in runs])
            scored, wrong, copied, nearer = counts.sum(axis=0).tolist()
            run_units = units_of(units, runs)
            copied_cell = _share([(int(c[2]), int(c[1])) for c in counts], run_units)
            nearer_cell = _share([(int(c[3]), int(c[2])) for c in counts], run_units)
            base = f"{t['baseline'] / copied:.2f}" if copied and t["baseline"] is not None else "–"
            lines.append(f"| {name} | {length} | {len(runs)}/{t['pooled']} | {wrong}/{scored} | {copied_cell} | {nearer_cell} "
                         f"| {base} |")
    if not lines:
        return []
    return ["", f"What the wrong answers were ({task}; eval/tasks/answers.py): each wrong answer decoded greedily and "
            "looked for earlier in the prompt. \"Copied\" is the share of the wrong answers that are another "
            "candidate written verbatim in the prompt (the rest are in it nowhere); \"nearer\" the share of those "
            "that sit after the asked needle, nearer the question, against a random pick of a wrong candidate "
            "(1 − depth averaged over the copied answers; – without depths); 95% intervals across training runs "
            "and instances, over the seeds that learned the task (else every seed, marked); \"seeds\" says how many of "
            "those seeds' cells kept what they wrote (cells scored before answers were kept hold none, and their "
            "seeds are left out of the row):", "",
            "| row | length | seeds | wrong | copied another candidate | of those, nearer the question | random pick |",
            "|---|---:|---:|---:|---|---|---:|", *lines] + _examples_table(shown_examples)


def _examples_table(lines: list[str]) -> list[str]:
    if not lines:
        return []
    return ["", "Examples: the first wrong answers of each row's first seed at each length (in depth order), the asked "
            "answer → the one written:", "", "| row | length | asked → written |", "|---|---:|---|", *lines]
