"""Compare training regimes by whether position can matter in them:
``ropelab regimes GRID.yaml... [--out DIR]``.

Each grid is one regime (a corpus, tokenizer, model shape and L; configs/ablations/regime-pilot/)
and has been run and reported by `ropelab ablate`. From each grid's results.json this table
sets, for every row of every regime, side by side:

- the **context gain** (eval/lm/context_use.py): mean NLL on positions [8, 16) minus mean NLL on
  [L/2, L) at L, with its interval across training runs; also as a share of the [8, 16)
  loss and in bits per byte of text (the gain in nats per token times the row's bits per
  byte over nats per token at L), because nats per token do not compare across tokenizers;
- the **breakdown length** on the same-token protocol: the grid lengths its seeds' breakdowns
  fall between, in tokens and multiples of L, and each seed's own;
- the **degradation** ppl(n) / ppl(L) at 2L and at the longest length, same tokens, with
  the interval across training runs;
- where the grid's report has the attention diagnostics (``eval.diagnostics.enabled``), a
  second table: each row's mean attended distance and attention entropy at L, 2L and the
  longest diagnosed length, as fractions of what uniform causal attention gives there
  (eval/diagnostics/report.py), so a breakdown can be set beside attention spreading out.

It chooses nothing: which regime a study should use is a judgement made from these numbers
(docs/results.md says which and why).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from ropelab.common.atomic import write_text_atomic
from ropelab.common.cli import entry_point, usage_when_empty
from ropelab.common.errors import DataError
from ropelab.configs.grid import load_grid
from ropelab.eval.lm.context_use import breakdown, breakdown_text, context_gain, position_bins
from ropelab.eval.diagnostics.tables import uniform_distance, uniform_entropy
from ropelab.eval.reporting.labels import label_order
from ropelab.eval.regenerate import read_results
from ropelab.eval.reporting.report_dir import PERPLEXITY, report_kind
from ropelab.eval.reporting.stats import Contrast
from ropelab.eval.reporting.tables import Comparison, degradation, percent, summarize, train_lengths
from ropelab.training.metrics import steady_train_seconds
from ropelab.training.run_dir import RunDir

PROTOCOL = "same-tokens"


def _corpus(results: dict) -> str:
    """The regime's corpus: the first one its results scored."""
    corpora = [r["corpus"] for r in results["results"] if r.get("status") == "ok"]
    if not corpora:
        raise DataError("the report has no scored rows; run the grid to the end first (`ropelab ablate GRID`)")
    return corpora[0]


def _gain_text(gain: Optional[Contrast], at_short: float, bits_per_nat: float) -> tuple[str, str, str]:
    if gain is None:
        return "–", "–", "–"
    est = gain.runs or gain.documents
    low, high = est.interval()
    one = "" if gain.runs else " (one seed)"
    # The row's bits per nat (its bytes per token at L) is one number per row, so the gain's interval
    # carries over to bits per byte by the same factor.
    b = bits_per_nat
    return (f"{gain.point:.3f} ({low:.3f} to {high:.3f}){one}", f"{100 * gain.point / at_short:.1f}%",
            f"{gain.point * b:.3f} ({low * b:.3f} to {high * b:.3f}){one}")


def _ratio(c: Optional[Comparison]) -> str:
    if c is None:
        return "–"
    if c.runs is None:
        return f"{percent(c.ratio)}% (one seed)"
    return f"{percent(c.ratio)}% ({percent(c.runs[0])} to {percent(c.runs[1])})"


def _bits_per_nat(summary: dict, label: str, train_len: int) -> float:
    """Bits per byte of text per nat per token for this row at L (its bytes per token)."""
    cell = summary[label].get(train_len, {})
    if not cell.get("bpb") or not cell.get("ppl"):
        return math.nan
    return cell["bpb"][0] / math.log(cell["ppl"])


def regime_rows(name: str, results: dict) -> list[list[str]]:
    """One table row per row (encoding) of one regime."""
    corpus = _corpus(results)
    summary = summarize(results, corpus, PROTOCOL)
    if not summary:
        raise DataError(f"{name}: nothing was scored on the same-token protocol; the grid's eval.protocols must "
                        "include same-tokens")
    bins, ratios, lens = position_bins(results, corpus), degradation(summary), train_lengths(summary)
    runs = {r["label"]: r for r in results["runs"]}
    out = []
    for label in sorted(summary, key=label_order):
        train_len = lens[label]
        longest = max(n for n, c in summary[label].items() if "cell" in c)
        row_bins = bins.get(label)
        gain = context_gain(row_bins) if row_bins else None
        short = next((float(c.seed_values().mean()) for first, end, c in row_bins or [] if (first, end) == (8, 16)), math.nan)
        seeds = [r for r in results["runs"] if r["label"] == label]
        minutes = np.mean([train_seconds(r) for r in seeds]) / 60 if seeds else math.nan
        wall = any(not at_usual_speed(r) for r in seeds)
        found = breakdown(summary, label)
        cell_l = summary[label].get(train_len, {})
        out.append([name, label, f"{runs[label]['params'] / 1e6:.2f}M", str(train_len),
                    f"{runs[label]['steps']} × {runs[label]['tokens_trained'] // runs[label]['steps']}",
                    f"{minutes:.1f}" + (" (wall)" if wall else ""), str(len(seeds)), f"{cell_l.get('ppl', math.nan):.2f}",
                    *_gain_text(gain, short, _bits_per_nat(summary, label, train_len)),
                    breakdown_text(found) if found else "–",
                    _ratio(ratios.get(label, {}).get(2 * train_len)),
                    f"{longest // train_len}L: " + _ratio(ratios.get(label, {}).get(longest))])
    return out


HEAD = ["regime", "row", "params", "L", "steps × tokens", "train min", "seeds", "ppl at L",
        "context gain, nats (95%)", "share of [8,16) loss", "gain, bits/byte (95%)", "breakdown length",
        "ppl 2L / L (95%)", "ppl longest / L (95%)"]


def _read_diagnostics(path: Path) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path} cannot be read as a diagnostics report's results.json ({e}); write it again with "
                        "`ropelab ablate` on the grid (its scored cells are reused)") from None
    if not isinstance(found, dict) or not isinstance(found.get("rows"), list):
        raise DataError(f"{path} is not a diagnostics report's results.json (it has no pooled rows)")
    return found


def _share(pooled: Optional[dict], uniform: float) -> str:
    if not pooled:
        return "–"
    mean, low, high = (pooled[k] for k in ("mean", "low", "high"))
    if low is None:
        return f"{mean / uniform:.2f}"
    return f"{mean / uniform:.2f} [{low / uniform:.2f}, {high / uniform:.2f}]"


def attention_rows(name: str, diagnostics: Optional[dict]) -> list[list[str]]:
    """One row per row of a regime's diagnostics report: attended distance and entropy at L,
    2L and the longest length, over uniform attention's (the diagnostics' pooled intervals)."""
    out = []
    for row in (diagnostics or {}).get("rows", []):
        lengths = {int(n): cell for n, cell in row["lengths"].items()}
        train_len = row["train_len"]
        if "entropy" not in lengths.get(train_len, {}):
            continue  # no attention matrix (linear attention)
        chosen = [train_len, 2 * train_len, max(lengths)]
        cells = [_share(lengths.get(n, {}).get("distance"), uniform_distance(n)) for n in chosen]
        cells += [_share(lengths.get(n, {}).get("entropy"), uniform_entropy(n)) for n in chosen]
        out.append([name, row["label"], f"{max(lengths) // train_len}L", *cells])
    return out


def _steady_seconds(run: dict) -> Optional[float]:
    steady = run.get("steady_train_seconds")
    if steady is None:
        steady = steady_train_seconds(RunDir(run["run"]).metrics, run.get("tokens_trained"))
    return steady


def train_seconds(run: dict) -> float:
    """A run's training time at its usual speed: the record's, else (results written before it
    was recorded) from its metrics.jsonl where the run is at hand, else the wall time recorded."""
    steady = _steady_seconds(run)
    return steady if steady is not None else run["train_seconds"]


def at_usual_speed(run: dict) -> bool:
    """Whether ``train_seconds(run)`` is at the run's usual speed, not the wall time (a run
    evaluated before the speed was recorded, whose metrics are no longer at hand)."""
    return _steady_seconds(run) is not None


ATTENTION_HEAD = ["regime", "row", "longest", "distance L", "distance 2L", "distance longest", "entropy L",
                  "entropy 2L", "entropy longest"]


def attention_markdown(grids: list[tuple[str, Optional[dict]]]) -> list[str]:
    rows = [row for name, diagnostics in grids for row in attention_rows(name, diagnostics)]
    missing = [name for name, diagnostics in grids if diagnostics is None]
    lines = ["", "## Attention as the length grows", ""]
    if rows:
        lines += ["Mean attended distance and attention entropy (over layers, heads and queries) as fractions of "
                  "uniform causal attention's at the same length ((n − 1)/4 tokens and the mean of ln(i + 1)); 1 is "
                  "attention spread evenly over the window. 95% interval across training runs (across windows for "
                  "one run), from each grid's diagnostics report (docs/diagnostics.md).", "",
                  "| " + " | ".join(ATTENTION_HEAD) + " |", "|" + "---|" * 3 + "---:|" * (len(ATTENTION_HEAD) - 3)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    if missing:
        lines += ["", "No diagnostics in the report of " + ", ".join(missing) + " (set `eval.diagnostics.enabled: "
                  "true` in the grid and run `ropelab ablate` on it again: finished runs and scored cells are reused)."]
    return lines


def regimes_markdown(grids: list[tuple[str, Path, dict]], diagnostics: Optional[dict] = None) -> str:
    """The regimes table; ``diagnostics`` maps a regime's name to its diagnostics results (or None)."""
    rows = [row for name, _, results in grids for row in regime_rows(name, results)]
    lines = ["# Regime pilot: where can positional encodings differ?", "",
             "Made by `ropelab regimes " + " ".join(str(p) for _, p, _ in grids) + "` from each grid's "
             "results.json. Context gain: mean NLL on positions [8, 16) minus mean NLL on [L/2, L) at L "
             "(non-overlapping windows), 95% interval across training runs; its share of the [8, 16) loss and its "
             "size in bits per byte compare across tokenizers, nats per token do not. Breakdown length: the "
             f"first evaluated length at which a seed's perplexity exceeds its own at L by 5% ({PROTOCOL} protocol), "
             "given as the grid lengths the seeds' breakdowns fall between and each seed's own. "
             "Ratios: perplexity at n over perplexity at L on the same tokens, paired by seed, with the interval "
             "across training runs. Press et al. (2022, Figure 1 and Table 2) is the pattern to compare with. "
             "Train min: each row's mean training time at its runs' usual speed (tokens trained over the median "
             "of the tokens/s each run logged, so a pause or a burst of other load does not count); \"(wall)\" marks "
             "a row with a run whose usual speed is unknown (its results predate that record and its metrics.jsonl is "
             "not at hand, or it logged no rate), read at its recorded wall time, pauses and contention included; "
             "equal compute is set by each grid's step budget (steps × tokens) at its shape, not by these "
             "minutes.", "",
             "| " + " | ".join(HEAD) + " |", "|" + "---|" * 2 + "---:|" * (len(HEAD) - 2)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if diagnostics is not None:
        lines += attention_markdown([(name, diagnostics.get(name)) for name, _, _ in grids])
    return "\n".join(lines) + "\n"


def _perplexity_results(grid, path: str) -> dict:
    """The perplexity report's results.json of ``grid`` (the file ``path``), or a DataError saying
    why there is none: a grid of synthetic tasks alone has only a task report, and a text grid
    whose report is not written yet is finished by ``ropelab ablate``."""
    found = grid.report_dir / "results.json"
    if not found.is_file() and all(run.cfg.data.source == "synthetic" for run in grid.plan()):
        raise DataError(f"{path} trains on synthetic tasks only, so it has a task report ({grid.report_dir / 'tasks'}) "
                        "and no perplexity report; ropelab regimes compares the perplexity reports of grids trained "
                        "on text: give those grids")
    if not found.is_file():
        raise DataError(f"{path} has no perplexity report yet ({found} does not exist): write it with ropelab "
                        f"ablate {path} (--report writes it from the runs that are finished), then compare")
    results = read_results(found)
    if report_kind(results) != PERPLEXITY:
        raise DataError(f"{found} is not a perplexity report; ropelab regimes compares the perplexity reports of "
                        "grids trained on text: give those grids")
    return results


@entry_point
def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="ropelab regimes", description=__doc__.split("\n\n")[0])
    parser.add_argument("grids", nargs="+", help="grid files whose reports to compare, one regime each")
    parser.add_argument("--out", help="write README.md here as well as printing it")
    usage_when_empty(parser, argv)
    args = parser.parse_args(argv)
    grids, diagnostics = [], {}
    for path in args.grids:
        grid = load_grid(path)
        grids.append((grid.name, Path(path), _perplexity_results(grid, path)))
        found = grid.report_dir / "diagnostics" / "results.json"
        diagnostics[grid.name] = _read_diagnostics(found) if found.is_file() else None
    text = regimes_markdown(grids, diagnostics)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.out) / "README.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
