"""The fine-tuning budget curve: perplexity against fine-tuning steps, per method.

Rows evaluated at several checkpoints (``eval.steps``; labels "ROW @ STEP") become, for
each row and length, a curve over steps with 95% intervals — the shape of Chen et al.
(2023, position interpolation) Table 3, which reports perplexity at fine-tuning steps 0,
200, …, 1000. Step 0 is the parent's weights under the child's RoPE scaling.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ropelab.eval.lm.plots import plot_budget
from ropelab.eval.reporting.labels import label_encodings
from ropelab.eval.reporting.tables import fmt, summarize


def budget_cells(results: dict, corpus: str, protocol: str) -> dict[str, dict[int, dict[int, dict]]]:
    """row -> step -> length -> cell, for the rows evaluated at several checkpoints."""
    out: dict[str, dict[int, dict[int, dict]]] = defaultdict(dict)
    for label, cells in summarize(results, corpus, protocol).items():
        if " @ " not in label:
            continue
        row, step = label.rsplit(" @ ", 1)
        out[row][int(step.split(" + ")[0])] = cells
    return dict(out)


def parent_lengths(results: dict) -> list[int]:
    """The distinct training lengths of the runs' parents (fine-tuned runs only)."""
    return sorted({r["parent"]["train_len"] for r in results["runs"] if r.get("parent")})


def budget_lengths(results: dict, cells: dict[str, dict[int, dict[int, dict]]]) -> list[int]:
    """The parent's training length L (what fine-tuning keeps of the short context), 4L and
    16L where evaluated, else the two longest."""
    parents = parent_lengths(results)
    evaluated = sorted({n for steps in cells.values() for by_length in steps.values() for n in by_length})
    wanted = [m * parents[0] for m in (1, 4, 16)] if parents else []
    return [n for n in wanted if n in evaluated] or evaluated[-2:]


def budget_section(results: dict, corpus: str, protocol: str, out: Path, index: int) -> list[str]:
    cells = budget_cells(results, corpus, protocol)
    if not cells:
        return []
    lengths = budget_lengths(results, cells)
    steps = sorted({s for by_step in cells.values() for s in by_step})
    plot = f"budget_{index}_{protocol}.png"
    plot_budget(cells, lengths, out / plot, corpus, label_encodings(results))
    parents = parent_lengths(results)
    where = (f"at {' and '.join(f'{n // parents[0]}×' if n % parents[0] == 0 else str(n) for n in lengths)} the "
             f"parent's training length ({parents[0]} tokens)" if len(parents) == 1 else "at the longest lengths")
    md = ["", "### Fine-tuning budget", "",
          "Perplexity (95% interval) after each number of fine-tuning steps; step 0 is the parent's weights "
          f"under the row's RoPE scaling. Shown {where}: at L, what fine-tuning for longer contexts costs the "
          "short context it was trained on.", ""]
    for length in lengths:
        md += [f"At {length} tokens:", "", "| row | " + " | ".join(f"step {s}" for s in steps) + " |",
               "|---|" + "---:|" * len(steps)]
        for row in sorted(cells):
            text = []
            for s in steps:
                cell = cells[row].get(s, {}).get(length, {})
                text.append(f"{fmt(cell['ppl'])} ({fmt(cell['low'])}–{fmt(cell['high'])})" if "ppl" in cell else "–")
            md.append(f"| {row} | " + " | ".join(text) + " |")
        md.append("")
    return md + [f"![budget curve]({plot})"]
