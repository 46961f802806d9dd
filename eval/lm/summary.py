"""The summary a perplexity report opens with: one table, then one sentence per finding.

The table is the report's first corpus on one protocol (the same target tokens at every
length where it was scored, so only the context grows; else non-overlapping windows, else
sliding): each study row's perplexity at L and at the longest length, its degradation
between them, and its paired comparison with the reference row at both, with the marks of
the section's own tables (eval/lm/comparisons.py: the same correction family, so the summary
never marks what the tables do not). Ablation rows (settings a sweep did not choose) stay in
the tables below. The sentences are read off those marks: which rows are lower or higher than
the reference after the correction, which are undecided at how many seeds (and how many the
observed difference would need), whose degradation differs from the reference's, and which
rows are heavy-tailed (their seeds' values are printed beside the interval).
"""

from __future__ import annotations

from typing import Optional

from ropelab.eval.lm.comparisons import marked_comparisons, relative_degradation
from ropelab.eval.reporting.ablations import is_ablation
from ropelab.eval.reporting.labels import budget_partner, label_order, plan_note
from ropelab.eval.reporting.stats import seeds_needed
from ropelab.eval.reporting.tables import (Comparison, degradation, degradation_text, heavy, ppl_text, ratio_text,
                                          seed_counts, short_number, summarize, train_lengths)

PROTOCOL_NAMES = {"same-tokens": "the same target tokens at every length", "nonoverlap": "non-overlapping windows",
                  "sliding": "sliding windows"}


def _protocol(results: dict, corpus: str) -> Optional[str]:
    scored = {r["protocol"] for r in results["results"] if r.get("corpus") == corpus}
    return next((p for p in ("same-tokens", "nonoverlap", "sliding") if p in scored), None)


def _times(n: int, train_len: int) -> str:
    return "L" if n == train_len else f"{n / train_len:g}L"


def _names(labels: list[str]) -> str:
    return ", ".join(f"`{label}`" for label in labels)


def _undecided(items: list[tuple[str, Comparison]]) -> str:
    """'`xpos` (at 5 seeds; 17 would decide the observed difference)', …"""
    parts = []
    for label, c in items:
        need = seeds_needed(c.found.runs, c.found.point)
        more = "more than 100 seeds would not decide it" if need is None else f"{need} seeds per row would decide it"
        parts.append(f"`{label}` (at {c.found.runs.seeds} seeds; {more})")
    return ", ".join(parts)


def _verdicts(cells: dict[str, Optional[Comparison]], lower: str, higher: str) -> list[str]:
    """The clauses of one finding: rows marked ▼, ▲ and ~, and rows with one seed."""
    marked = {m: [label for label, c in cells.items() if c is not None and c.mark == m] for m in "▼▲~"}
    single = [label for label, c in cells.items() if c is not None and c.runs is None and not c.identical]
    parts = []
    if marked["▼"]:
        parts.append(f"{lower}: {_names(marked['▼'])}")
    if marked["▲"]:
        parts.append(f"{higher}: {_names(marked['▲'])}")
    if marked["~"]:
        parts.append("undecided " + _undecided([(label, cells[label]) for label in marked["~"]]))
    if single:
        parts.append(f"one seed, so no test: {_names(single)}")
    return parts


def summary_section(results: dict, reference: str) -> list[str]:
    """The report's opening: ``## Summary``, its table and its findings (none without results)."""
    corpus = next((r["corpus"] for r in results["results"] if r.get("corpus")), None)
    protocol = _protocol(results, corpus) if corpus else None
    if protocol is None:
        return []
    summary = summarize(results, corpus, protocol)
    ablations = results.get("ablations") or {}
    study = sorted((label for label in summary if not is_ablation(label, ablations)), key=label_order)
    lengths = sorted({n for cells in summary.values() for n in cells})
    own_lens = train_lengths(summary)
    train_len = own_lens.get(reference) or min(own_lens.values(), default=lengths[0])
    longest = lengths[-1]
    marked = marked_comparisons(results, corpus, protocol, summary, reference) if reference in summary else None
    own = degradation(summary)
    relative, _ = relative_degradation(summary, reference, marked.folded if marked else {}, ablations)

    def versus(label: str, n: int) -> Optional[Comparison]:
        partner = budget_partner(label, reference)
        return (marked.study.get(f"{label} vs {partner}", {}).get(n)) if marked else None

    def at_longest(label: str) -> float:
        cell = summary[label].get(longest, {})
        return cell.get("ppl", float("inf"))

    rows = sorted(study, key=lambda label: (at_longest(label), label_order(label)))
    # Rows trained at different lengths (a fine-tune beside its parent) are each read at their own L.
    mixed = len({own_lens.get(label, train_len) for label in rows}) > 1
    far = str(longest) if mixed else _times(longest, train_len)
    head_l, head_n = ("L (each row's own)", str(longest)) if mixed else (f"{train_len} (L)", f"{longest} ({far})")
    table = [f"| row | seeds | ppl at {head_l} | ppl at {head_n} | {far} / L "
             f"| vs `{reference}` at L | vs `{reference}` at {far} |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label in rows:
        cells, own_l = summary[label], own_lens.get(label, train_len)
        compared = [versus(label, n) for n in (own_l, longest)]
        table.append(f"| {label} | {seed_counts(cells)} | {ppl_text(cells.get(own_l))} | "
                     f"{ppl_text(cells.get(longest))} | {degradation_text(own.get(label, {}).get(longest))} | "
                     + " | ".join("" if c is None else ratio_text(c, "runs" if c.runs else "documents")
                                  for c in compared) + " |")
    where = f"{corpus}, {PROTOCOL_NAMES[protocol]}"
    lines = ["", "## Summary", "",
             f"On {where}: perplexity with its 95% interval across training runs (†: one seed, across documents), "
             f"its growth from L to {longest}, and the paired difference from `{reference}` (▼/▲: the test across "
             "training runs survives the Benjamini–Hochberg correction of the section's table; ~: undecided); "
             f"sorted by perplexity at {longest}. The tables below hold every length, protocol and corpus."
             + plan_note(rows), "", *table, ""]
    if mixed:  # the findings read one L; rows of several are read in the tables below
        return lines + ["- The rows were trained at different lengths (L per row: "
                        + ", ".join(f"`{label}` {own_lens.get(label, train_len)}" for label in rows)
                        + "); the sections below compare them at each length."]
    return lines + _findings(summary, rows, versus, relative, own, reference, train_len, longest, where, results)


def _findings(summary: dict, rows: list[str], versus, relative: dict, own: dict, reference: str, train_len: int,
              longest: int, where: str, results: dict) -> list[str]:
    """One sentence per finding, each read off the summary's marks and intervals."""
    found = []
    if reference not in summary:
        found.append(f"No paired comparisons: the reference row `{reference}` is none of these rows.")
    for n in (train_len, longest):
        parts = _verdicts({label: versus(label, n) for label in rows if label != reference},
                          f"lower perplexity than `{reference}`", "higher")
        if parts:
            found.append(f"At {n} ({_times(n, train_len)}) on {where}, after the correction: " + "; ".join(parts) + ".")
    if longest != train_len and relative:
        cells = {name.split(" vs ")[0]: cells.get(longest) for name, cells in relative.items()}
        parts = _verdicts(cells, f"perplexity grows less than `{reference}`'s", "grows more")
        if parts:
            found.append(f"From L to {longest} ({_times(longest, train_len)}), after the correction: "
                         + "; ".join(parts) + ".")
    for label in rows:
        c = own.get(label, {}).get(longest)
        if c is not None and c.runs is not None and c.per_seed and heavy(*c.interval):
            seeds = ", ".join(f"×{short_number(value)}" for value in c.per_seed)
            found.append(f"`{label}` is heavy-tailed at {longest}: its interval spans more than a factor 10, and "
                         f"its seeds' own growth from L is {seeds}.")
    if results.get("missing"):
        found.append(f"{len(results['missing'])} runs of the grid are missing (listed under Runs); a mark may change "
                     "when they arrive.")
    return [f"- {sentence}" for sentence in found]
