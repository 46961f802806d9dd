"""Context use and breakdown length, against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ropelab.eval.lm.context_use import breakdown, breakdown_text, context_gain, first_above, position_cells
from ropelab.eval.lm.extrapolation import share_window_sets
from ropelab.eval.lm.perplexity import perplexity
from ropelab.eval.reporting.stats import Cell
from helpers.reference import ContextFree


def test_first_above_gives_the_grid_lengths_a_breakdown_lies_between():
    # ln 1.05 = 0.04879 is first exceeded at 512 (0.06), after 256 (0.02): the breakdown lies in (256, 512].
    assert first_above([64, 128, 256, 512, 1024], [0.3, 0.0, 0.02, 0.06, 0.2], 128) == (256, 512)
    assert first_above([128, 256], [0.0, 0.01], 128) is None  # never 5% worse
    assert first_above([128, 256], [0.0, 0.1], 128) == (128, 256)  # the first length past L: from L
    assert first_above([256, 384], [math.log(1.05), 0.2], 128) == (256, 384)  # exactly 5% is not above


def _summary(per_seed_log_ppl: dict[int, list[float]], train_len: int = 128, units: tuple = ()) -> dict:
    """A one-row summary whose cells have the given per-seed mean NLLs (one unit, 100 tokens)."""
    cells = {}
    for n, values in per_seed_log_ppl.items():
        cell = Cell(nll=np.array(values)[:, None] * 100, tokens=np.array([100.0]), seeds=tuple(range(len(values))),
                    units=units)
        cells[n] = {"cell": cell, "train_len": train_len, "ppl": math.exp(np.mean(values))}
    return {"row": cells}


def test_a_breakdown_is_the_grid_values_its_seeds_fall_between():
    """Three seeds first above 5% at 256, 256 and 192: the row's breakdowns lie between 128 (the
    length before 192) and 256, and each seed's own first length is listed in seed order; no
    length between grid points (a geometric mean or an interpolated crossing) appears."""
    s = _summary({128: [4.0, 4.1, 4.2], 192: [4.03, 4.12, 4.3], 256: [4.1, 4.2, 4.3], 512: [4.4, 4.5, 4.6]})
    found = breakdown(s, "row")
    assert found["per_seed"] == [256, 256, 192] and (found["low"], found["high"]) == (128, 256)
    assert found["beyond"] == 0 and found["longest"] == 512
    assert breakdown_text(found) == "128–256 (×1–×2 L); seeds 256, 256, 192"
    same = breakdown(_summary({128: [4.0, 4.1], 256: [4.01, 4.11], 512: [4.1, 4.2]}), "row")
    assert breakdown_text(same) == "256–512 (×2–×4 L); seeds 512, 512"  # identical weights need no special case
    one = breakdown(_summary({128: [4.0], 256: [4.01], 512: [4.1]}), "row")
    assert breakdown_text(one) == "256–512 (×2–×4 L); one seed"


def test_a_seed_that_stays_within_five_percent_reads_beyond_the_longest_length():
    split = breakdown(_summary({128: [4.0, 4.1], 1024: [4.01, 4.3], 2048: [4.02, 4.4]}), "row")
    assert split["per_seed"] == [None, 1024] and split["beyond"] == 1
    assert breakdown_text(split) == "past 128 (×1 L); seeds > 2048, 1024"
    flat = breakdown(_summary({128: [4.0, 4.1], 2048: [4.01, 4.11]}), "row")
    assert flat["low"] is None and breakdown_text(flat) == "> 2048 (all 2 seeds)"
    assert breakdown_text(breakdown(_summary({128: [4.0], 2048: [4.01]}), "row")) == "> 2048"
    # Lengths below L and a row not scored past L: no breakdown to give.
    assert breakdown(_summary({64: [3.9], 128: [4.0]}), "row") is None
    assert breakdown(_summary({64: [3.9, 4.0], 128: [4.0, 4.1], 256: [4.2, 4.2]}), "row")["per_seed"] == [256, 256]


def test_context_gain_is_the_difference_of_two_position_bins():
    """Two seeds of a context-free model at L = 64: the gain is mean NLL on [8, 16) minus on
    [32, 64), computed from the windows by hand, and its interval covers 0 (no context used)."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 40, (20_000,)).numpy()
    tokens[::150] = 39  # documents
    rows = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = ContextFree(40)
        found = perplexity(model, tokens, 64, eot_id=39).to_dict()
        found.pop("curve")
        rows.append({**found, "run": f"r{seed}", "seed": seed, "status": "ok"})
        x = torch.from_numpy(tokens[:-1][: found["windows"] * 64].astype(np.int64)).view(-1, 64)
        y = torch.from_numpy(tokens[1:][: found["windows"] * 64].astype(np.int64)).view(-1, 64)
        nll = model(x, targets=y, reduction="none").detach().double()
        rows[-1]["by_hand"] = float(nll[:, 8:16].mean() - nll[:, 32:64].mean())
    window_sets = share_window_sets(rows)
    bins = position_cells(rows, window_sets)
    assert [(a, b) for a, b, _ in bins] == [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 32), (32, 64)]
    gain = context_gain(bins)
    assert gain.point == pytest.approx(np.mean([r["by_hand"] for r in rows]), abs=1e-4)
    low, high = gain.runs.interval()
    assert low < 0 < high


def test_breakdowns_of_fine_tunes_list_every_run_and_the_tables_count_each_parent_once():
    """Four fine-tunes, two of each parent: the breakdown lists every run's own first length (a
    list needs no weights), and the tables give each perplexity cell the parents as units."""
    values = {128: [4.0, 4.0, 4.0, 4.0], 256: [4.03, 4.03, 4.06, 4.06], 512: [4.1, 4.1, 4.1, 4.1]}
    found = breakdown(_summary(values, units=("a", "a", "b", "b")), "row")
    assert breakdown_text(found) == "128–512 (×1–×4 L); seeds 512, 512, 256, 256"
    from ropelab.eval.reporting.tables import summarize
    runs = [{"run": f"ft{p}{k}", "seed": k, "parent": {"run": f"parent-{p}", "checkpoint": "step_7"}}
            for p in "ab" for k in (0, 1)]
    rows = [{"run": r["run"], "seed": r["seed"], "corpus": "c", "protocol": "sliding", "encoding": "rope",
             "scaling": "none", "length": 128, "train_len": 128, "status": "ok", "tokens": 200, "documents": 2,
             "unit_nll": [400.0 + i, 404.0 - i], "unit_kind": "document", "unit_tokens": [100, 100],
             "unit_bytes": [0, 0]} for i, r in enumerate(runs)]
    window_sets = share_window_sets(rows)
    cell = summarize({"runs": runs, "results": rows, "window_sets": window_sets}, "c", "sliding")["rope"][128]
    assert cell["cell"].replicates == 2 and cell["cell"].units == ("parent-a@step_7", "parent-b@step_7") * 2
    assert cell["seeds"] == 4


def test_rows_pair_by_seed_and_fine_tunes_also_by_parent():
    """Rows of different runs trained with the same seeds pair seed by seed (each run its own
    unit); rows of fine-tunes pair by seed and parent, with the parents as the replicates."""
    from ropelab.eval.reporting.tables import compare

    def results(parents: bool) -> dict:
        runs = [{"run": f"{enc}-{p}{k}", "seed": k,
                 **({"parent": {"run": f"parent-{p}", "checkpoint": "step_7"}} if parents else {})}
                for enc in ("rope", "alibi") for p in ("ab" if parents else "a") for k in (0, 1)]
        rows = [{"run": r["run"], "seed": r["seed"], "corpus": "c", "protocol": "sliding", "encoding": r["run"][:4],
                 "scaling": "none", "length": 128, "train_len": 128, "status": "ok", "tokens": 200, "documents": 2,
                 "unit_nll": [400.0 + r["seed"] + 3 * (r["run"][-2] == "b") + (r["run"][0] == "a"), 404.0 - r["seed"]],
                 "unit_kind": "document", "unit_tokens": [100, 100], "unit_bytes": [0, 0]} for r in runs]
        return {"runs": runs, "results": rows, "window_sets": share_window_sets(rows)}

    for parents, replicates in ((False, 2), (True, 2)):
        found = compare(results(parents), "c", "sliding", [("alib", "rope")])["alib vs rope"][128].found.runs
        assert found.pairing == "seed" and found.seeds == replicates
        # alibi = rope + 1 nat on the first document of every run: +1/200 per token, the same per seed.
        assert found.point == pytest.approx(1 / 200) and found.parts[0].variance == pytest.approx(0, abs=1e-15)

