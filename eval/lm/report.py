"""Turn extrapolation results into report.md, results.json and PNG plots.

Rows are an encoding (plus RoPE scaling); runs that are the same experiment apart from
the seed are one row. Every perplexity carries a 95% interval, every comparison is
paired on identical tokens and marked when significant (eval/reporting/stats.py, eval/reporting/tables.py).
The report states each run's commit and whether all runs come from one clean commit,
the corpora, how many tokens and documents were scored, and what each RoPE scaling did
at each length. Lengths a learned table cannot serve read "n/a (trained table: N
positions)" and are left out of the plots.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from ropelab.common.atomic import write_text_atomic
from ropelab.common.report_json import dumps_report
from ropelab.common.storage import is_storage_error, make_dir, storage_error
from ropelab.eval.reporting.ablations import ablations_note, is_ablation, sweep_ablations
from ropelab.eval.lm.finetune_budget import budget_section
from ropelab.eval.lm.context_use import breakdown_section, context_section
from ropelab.eval.lm.comparisons import folded_rows, marked_comparisons, relative_degradation
from ropelab.eval.lm.summary import summary_section
from ropelab.eval.reporting.labels import label_encodings, parents_note, row_label, split_step
from ropelab.eval.reporting.like_for_like import unlike_rows
from ropelab.eval.reporting.reference import no_default_reference, report_reference
from ropelab.eval.reporting.report_dir import check_report_dir, report_kind
from ropelab.eval.reporting.runs_section import (evaluation_provenance, incomplete_note, missing_lines, provenance,
                                                 runs_table)
from ropelab.eval.lm.plots import plot_paired, plot_per_position, plot_perplexity, plot_training
from ropelab.eval.reporting.tables import (comparison_table, degradation, degradation_table, has_power,
                                          interval_table, length_table, power_table, scored_line, summarize,
                                          train_lengths)
from ropelab.training.metrics import read_records
from ropelab.training.run_dir import RunDir

PROTOCOL_TITLES = {
    "nonoverlap": "Non-overlapping windows (ALiBi paper protocol)",
    "sliding": "Sliding windows (each scored token has ≥ L−S tokens of context)",
    "same-tokens": "Same target tokens at every length (only the context before them grows)",
}
MARKS = ("Marks: ▼ lower perplexity than the row compared with, ▲ higher, ~ neither, where the test across "
         "training runs rejects no change after the Benjamini–Hochberg correction over the {tested} comparisons of "
         "this table that are tests (a 5% false discovery rate among the marks; eval/reporting/stats.py); each printed "
         "interval is the unadjusted 95% one. A row with one seed has no interval across training runs and no mark.")
INTERVALS = ("Intervals across training runs: a t-interval over the seeds' values with the documents' variance added "
             "(Welch–Satterthwaite degrees of freedom), so they say what another set of training runs would give; "
             "† marks a row with one seed, whose interval is across documents only. Across documents for these "
             "trained models: the ratio estimator's variance over the units, the trained models held fixed.")


def regenerate_line(out: Path) -> str:
    """The one command that writes this report again from its results.json (``out``: where it is
    written, named as the repository names it where it lies inside the working directory)."""
    path = Path(out)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            pass
    return f"Regenerate it from its results.json alone: `ropelab regenerate {path.as_posix()}/results.json`."


def _remade(results: dict) -> str:
    return f", made again {results['remade']} from its results.json (ropelab regenerate)" if results.get("remade") else ""


def _scale_table(rows: list[dict], lengths: list[int]) -> list[str]:
    """What each scaling did at each length, per row (its factor and effective scale): rows
    trained at different lengths (a fine-tune beside its parent) scale differently."""
    seen: dict[str, dict[int, tuple]] = {}
    about: dict[str, dict] = {}  # label -> a row of it (its scaling, base row and training length)
    for row in rows:
        if row["scaling"] != "none" and "effective_scale" in row:
            label = row_label(row)
            seen.setdefault(label, {})[row["length"]] = (row["scaling_factor"], row["effective_scale"])
            about[label] = row
    if not seen:
        return []
    one = len({row.get("label") for row in about.values()}) == 1  # one row scaled: lines named by scaling
    names = {label: row["scaling"] if one else label for label, row in about.items()}
    table = [([names[label]], about[label]["train_len"],
              [f"{cells[n][0]:g} → {cells[n][1]:g}" if n in cells else "–" for n in lengths])
             for label, cells in sorted(seen.items(), key=lambda item: names[item[0]])]
    return ["", "### What each RoPE scaling did", "",
            "Cells: factor s in the scaling's config → effective scale at that length. Static methods use "
            "s = L_eval / L_train (plain RoPE up to L); dynamic NTK keeps s = 1 and scales by "
            "L_eval / L_train by itself (transformers' semantics). Every window is exactly L_eval tokens, "
            "so dynamic NTK there is NTK at s = L_eval / L_train: where two scalings give bit-identical "
            "rotary tables at a length, the cell is scored once and shared (`same_as` in results.json).", "",
            length_table(["scaling" if one else "row"], lengths, table)]


def _corpus_line(settings: dict) -> str:
    """What was scored: source, split, documents, protocols, lengths and the token budget."""
    budget = ("the whole split" if settings.get("max_tokens") is None
              else f"up to {settings['max_tokens']:,} tokens per length and protocol")
    size = f" ({settings['split_tokens']:,} tokens)" if settings.get("split_tokens") else ""
    return (f"Corpus: {settings['source']}; split: {settings['split']}{size}; documents: {settings['documents']}. "
            f"Scored: {budget}, protocols {', '.join(settings['protocols'])}, lengths "
            f"{', '.join(map(str, settings['lengths']))}.")


def training_curves(runs: list[dict]) -> dict[str, dict[str, list]]:
    """Each run's training and validation loss against tokens, from its metrics.jsonl."""
    curves = {}
    for run in runs:
        path = RunDir(run["run"]).metrics
        if not path.is_file():
            continue
        curve: dict[str, list] = {"tokens": [], "loss": [], "val_tokens": [], "val_loss": []}
        for record in read_records(path):
            if record.get("loss") is not None:
                curve["tokens"].append(record["tokens"])
                curve["loss"].append(record["loss"])
            if record.get("val_loss") is not None:
                curve["val_tokens"].append(record["tokens"])
                curve["val_loss"].append(record["val_loss"])
        if curve["tokens"]:
            curves[run.get("label") or run["name"]] = curve
    return curves


def _training_section(results: dict, out: Path) -> list[str]:
    """The training curves, from results.json (written there the first time) or the runs' metrics.
    A report made again where neither has them keeps the figure drawn when the runs were at hand."""
    curves = results.get("training_curves")
    if not curves:
        if (out / "training_loss.png").is_file():
            return ["", "## Training", "", "Training loss (lines) and validation loss (markers) against tokens "
                    "trained, drawn from the runs' metrics.jsonl when this report was first made (the runs are "
                    "not at hand now):", "", "![training loss vs tokens](training_loss.png)"]
        return []
    plot_training(curves, out / "training_loss.png", label_encodings(results))
    return ["", "## Training", "", "Training loss (lines) and validation loss (markers) against tokens trained, "
            "from each run's metrics.jsonl:", "", "![training loss vs tokens](training_loss.png)"]


def _identical_note(same: dict[str, str]) -> str:
    """Which rows repeat an earlier one exactly, and so have no comparisons of their own."""
    if not same:
        return ""
    parts = [f"`{label}` equals `{kept}`" for label, kept in same.items()]
    why = (" (dynamic NTK fitted to a window of exactly L_eval tokens is NTK with s = L_eval / L_train: "
           "the same rotary tables)" if any(l.endswith("+ dynamic") and k.endswith("+ ntk") for l, k in same.items())
           else "")
    return (" " + "; ".join(parts) + " bit for bit at every length" + why +
            ", so only " + ", ".join(f"`{k}`" for k in dict.fromkeys(same.values())) + " is compared.")


def _pairing_note(reference: str) -> str:
    row, step = split_step(reference)
    if step is None:
        return ""
    return (f" Each fine-tuned row is compared with `{row}` after the same number of steps, and `{row}`'s "
            f"own checkpoints with its step {step}.")


def _pairing(comparisons: dict) -> str:
    """How the comparisons were paired across training runs."""
    welch = sorted(name for name, cells in comparisons.items() if any(c.found.runs is not None and
                                                                      c.found.runs.pairing == "welch"
                                                                      for c in cells.values()))
    single = sorted(name for name, cells in comparisons.items() if any(c.found.runs is None for c in cells.values()))
    parts = ["Rows trained with the same seeds are paired seed by seed (seed k's rows share its data order, and "
             "its initialisation where shapes agree)"]
    if welch:
        parts.append("rows whose seeds differ are compared unpaired (Welch): " + ", ".join(f"`{n}`" for n in welch))
    if single:
        parts.append("comparisons involving a one-seed row have no interval across training runs: "
                     + ", ".join(f"`{n}`" for n in single))
    return "; ".join(parts) + "."


def marks_text(tested: int) -> str:
    """The sentence on marks, where the table has tests to mark (none: no sentence)."""
    return " " + MARKS.format(tested=tested) if tested else ""


def _paired_section(results: dict, corpus: str, protocol: str, summary: dict, reference: str,
                    out: Path, index: int, encodings: dict[str, str]) -> list[str]:
    """The paired comparisons with the reference row: the tables and figure, or a sentence
    saying why there are none. Comparisons of ablation rows (eval/reporting/ablations.py) come last, in a
    table and a correction of their own, and are not drawn."""
    if reference not in summary:
        return [f"Paired comparisons: none; the reference row `{reference}` (eval.reference) is none of "
                f"these rows{no_default_reference(results)}. Name one with `--reference ROW`; the evaluations "
                "are cached."]
    marked = marked_comparisons(results, corpus, protocol, summary, reference)
    comparisons, extra = marked.study, marked.ablations
    if not any(comparisons.values()) and not any(extra.values()):
        why = (f"`{reference}` is the only row" if len(summary) == 1 else
               "no row was scored on the same tokens as the row it would be compared with")
        return [f"Paired comparisons: none; {why}, so there is nothing to compare."]
    lengths = sorted({n for cells in summary.values() for n in cells})
    train_lens = train_lengths(summary)
    lines = _study_comparisons(comparisons, reference, marked, lengths, train_lens) if any(comparisons.values()) else [
        "Paired comparisons of the study's rows: none; every row but the reference is an ablation."]
    if any(extra.values()):
        lines += ["", "Ablations against the reference (settings the sweep did not choose), across training runs; "
                  "corrected as a family of their own. " + _pairing(extra) + marks_text(marked.ablations_tested),
                  "", comparison_table(extra, lengths, train_lens)]
    if any(comparisons.values()) and split_step(reference)[1] is None:  # a budget grid's figure is the budget curve
        figure = f"paired_vs_length_{index}_{protocol}.png"
        if plot_paired(comparisons, reference, sorted(set(train_lens.values())), out / figure,
                       f"{corpus}: {PROTOCOL_TITLES[protocol]}, relative to {reference}", encodings):
            lines += ["", f"![perplexity relative to {reference}]({figure})"]
    return lines


def _across_runs(comparisons: dict) -> bool:
    """Whether any comparison has an interval across training runs (else only the documents' is one)."""
    return any(c.runs is not None and not c.identical for cells in comparisons.values() for c in cells.values())


def _study_comparisons(comparisons: dict, reference: str, marked, lengths: list[int], train_lens: dict) -> list[str]:
    """The study rows' comparisons: across training runs (marked), across documents, and power,
    each printed once: where every comparison has one seed a side, only the documents' table."""
    intro = ("Paired comparisons on the same tokens: how much higher (+) or lower (−) the first row's "
             "perplexity is than the second's")
    notes = f"{_pairing_note(reference)}{_identical_note(marked.folded)} {_pairing(comparisons)}"
    if not _across_runs(comparisons):
        return [f"{intro}, with its 95% interval across documents for these trained models: each row has one "
                f"seed, so there is no interval across training runs, no test and no mark.{notes}", "",
                comparison_table(comparisons, lengths, train_lens, which="documents")]
    lines = [f"{intro}, with its 95% interval across training runs.{notes}{marks_text(marked.tested)}", "",
             comparison_table(comparisons, lengths, train_lens), "",
             "The same comparisons across documents for these trained models (how sure we are of these models' "
             "difference, not of the method's):", "",
             comparison_table(comparisons, lengths, train_lens, which="documents")]
    if has_power(comparisons):
        lines += ["", "Power across training runs: the smallest difference each comparison detects with its seeds "
                  "(80% power, two-sided 5%, before the multiplicity correction) · the seeds per row the observed "
                  "difference would need (>100: more documents, not seeds, would decide it):", "",
                  power_table(comparisons, lengths, train_lens)]
    return lines


def _degradation_section(summary: dict, protocol: str, reference: str, lengths: list[int],
                         folded: dict[str, str], ablations: dict[str, str]) -> list[str]:
    """ppl(kL)/ppl(L) per row with its interval, and its paired difference from the reference's
    (not for ``folded`` rows, which repeat another, nor for ablations, nor in a budget grid,
    which pairs by step)."""
    own = degradation(summary)
    if not any(own.values()):
        return []
    train_lens = train_lengths(summary)
    paired = "the same tokens at both lengths, so also paired by document" if protocol == "same-tokens" else \
        "different tokens at each length (their document variances add)"
    seeds = "95% interval across training runs" if _across_runs(own) else \
        "95% interval across documents (one seed per row)"
    lines = ["", f"Degradation: each row's perplexity over its own at its training length L, {seeds} "
             f"(paired by seed; {paired}):", "", degradation_table(own, lengths, train_lens)]
    relative, tested = relative_degradation(summary, reference, folded, ablations)
    if tested:
        lines += ["", f"Degradation relative to `{reference}`: how much more (+) or less (−) each row's perplexity "
                  f"grows from L than `{reference}`'s, 95% interval across training runs." + marks_text(tested), "",
                  degradation_table(relative, lengths, train_lens, relative=True)]
    return lines


def _protocol_section(results: dict, corpus: str, protocol: str, reference: str, out: Path, index: int) -> list[str]:
    summary = summarize(results, corpus, protocol)
    lengths = sorted({n for cells in summary.values() for n in cells})
    plot = f"ppl_vs_length_{index}_{protocol}.png"
    train_lens = sorted(set(train_lengths(summary).values()))
    ablations = results.get("ablations") or {}
    encodings = label_encodings(results)
    plot_perplexity({label: cells for label, cells in summary.items() if not is_ablation(label, ablations)},
                    train_lens, out / plot, f"{corpus}: {PROTOCOL_TITLES[protocol]}", encodings)
    rows = [r for r in results["results"] if r.get("corpus") == corpus and r["protocol"] == protocol]
    several = any(c.get("interval") == "runs" for cells in summary.values() for c in cells.values())
    tables = (["Perplexity, 95% interval across training runs:", "", interval_table(summary, lengths), "",
               scored_line(summary, lengths), "",
               "Perplexity, 95% interval across documents for these trained models:", "",
               interval_table(summary, lengths, key="documents")] if several else
              ["Perplexity, 95% interval across documents for these trained models (one seed per row, so no "
               "interval across training runs):", "", interval_table(summary, lengths, key="documents"), "",
               scored_line(summary, lengths)])
    return ["", f"### {PROTOCOL_TITLES[protocol]}", "", *tables, "",
            f"![perplexity vs length]({plot})", "",
            *_paired_section(results, corpus, protocol, summary, reference, out, index, encodings),
            *_degradation_section(summary, protocol, reference, lengths,
                                  folded_rows(results, corpus, protocol, summary, reference), ablations), "",
            f"Bits per byte (95% interval across {'training runs; † across documents' if several else 'documents'}):",
            "", interval_table(summary, lengths, key="bpb"),
            *_scale_table(rows, lengths)]


# The figures a report draws (eval/lm/plots.py, eval/lm/finetune_budget.py): once a new report is written, an
# earlier report's that it does not link are removed, so none is left beside it. Files of other
# names (e.g. scripts/position_bias.py's figure) are kept.
REPORT_FIGURES = ("training_loss.png", "ppl_vs_length_*.png", "paired_vs_length_*.png", "per_position_*.png",
                  "budget_*.png")


def write_report(results: dict, out: Path, carried: tuple[Path, ...] = ()) -> None:
    """results.json, report.md and the figures; the runs' training curves are kept in
    results.json, so a report can be made again from it alone (ropelab regenerate).
    ``carried``: figures of the report made again elsewhere (write_report_files)."""
    found = sweep_ablations(out, results["runs"])
    if found is not None:  # else those recorded when the report was first made (eval.remake elsewhere)
        results["ablations"] = found
    if not results.get("training_curves"):
        curves = training_curves(results["runs"])
        if curves:
            results["training_curves"] = curves
    write_report_files(out, results, lambda: _write_markdown(results, out), REPORT_FIGURES, carried)


def write_report_files(out: Path, results: dict, write_markdown: Callable[[], str], figures: tuple[str, ...],
                       carried: tuple[Path, ...] = ()) -> None:
    """results.json, then ``write_markdown()`` (which draws the figures and writes report.md,
    returning its text), then an earlier report's figures (glob ``figures``) that it does not link
    are removed: only after the new report is whole, so a failed write loses nothing. ``carried``
    are figures results.json cannot draw again (a report made again elsewhere, eval.remake): copied
    into ``out`` first, so the markdown links them. A refusal of the file system is a StorageError
    naming ``out``."""
    check_report_dir(out, report_kind(results))
    try:
        make_dir(out, "the report directory")
        for figure in carried:  # never the report's own directory (eval.remake.carried_figures)
            shutil.copyfile(figure, out / figure.name)
        write_text_atomic(out / "results.json", dumps_report(results))
        markdown = write_markdown()
        for pattern in figures:
            for stale in out.glob(pattern):
                if f"]({stale.name})" not in markdown:
                    stale.unlink()
    except OSError as e:
        if not is_storage_error(e):
            raise
        raise storage_error(e, f"write the report in {out}") from None


def _write_markdown(results: dict, out: Path) -> str:
    """Write report.md (and its figures) into ``out``; returns the markdown."""
    runs, rows = results["runs"], results["results"]
    reference, why = report_reference(results)
    train_lens = sorted({r["train_len"] for r in rows})
    md = ["# Length extrapolation report", "",
          f"Created {results['created']}{_remade(results)}. Training length L = {', '.join(map(str, train_lens))}"
          f"{' (each row its own: the L column)' if len(train_lens) > 1 else ''}. {regenerate_line(out)}",
          *(["", unlike] if (unlike := unlike_rows(results)) else []), *incomplete_note(results.get("missing")),
          *summary_section(results, reference),
          "", "## How to read this report", "",
          "A cell is the perplexity exp(mean over seeds of the mean NLL per token); rows pool the runs that are the "
          "same experiment apart from the seed. " + INTERVALS, *parents_note(runs), *(["", why] if why else []),
          "", "## Runs", "", *provenance(runs), *evaluation_provenance(rows), "",
          *runs_table(runs), *ablations_note(results.get("ablations") or {})]
    if results.get("missing"):
        md += ["", "**Missing runs** (not in the tables):", ""]
        md += missing_lines(results["missing"])
    md += _training_section(results, out)
    corpora = list(dict.fromkeys(r["corpus"] for r in rows))
    for index, corpus in enumerate(corpora):
        within = any(r.get("within_document") for r in rows if r["corpus"] == corpus)
        settings = results.get("corpora", {}).get(corpus)
        md += ["", f"## {corpus}", "", *([_corpus_line(settings), ""] if settings else []),
               "Windows stay inside documents." if within else "Windows run over the split as one stream."]
        protocols = [p for p in PROTOCOL_TITLES if any(r["corpus"] == corpus and r["protocol"] == p for r in rows)]
        for protocol in protocols:
            md += budget_section(results, corpus, protocol, out, index)
            md += _protocol_section(results, corpus, protocol, reference, out, index)
        md += context_section(results, corpus)
        md += breakdown_section({p: summarize(results, corpus, p) for p in protocols})
        curves = {run: by_corpus.get(corpus, {}) for run, by_corpus in results["per_position"].items()}
        if any(curves.values()):
            name = f"per_position_{index}.png"
            ablations = results.get("ablations") or {}
            drawn = [run for run in runs if not is_ablation(run.get("label") or run["name"], ablations)]
            plot_per_position(drawn, {run["run"]: curves[run["run"]] for run in drawn if run["run"] in curves},
                              train_lens, out / name, corpus)
            md += ["", "### Loss by position", "",
                   "At each row's longest evaluated length (non-overlapping windows), log-spaced position bins; "
                   "the band is a 95% interval over windows and seeds.", "", f"![loss by position]({name})"]
    text = "\n".join(md) + "\n"
    write_text_atomic(out / "report.md", text)
    return text

