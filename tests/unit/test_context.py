"""Context use and breakdown length, against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ropelab.eval.lm.context_use import breakdown, breakdown_text, context_gain, crossing, position_cells
from ropelab.eval.lm.extrapolation import share_window_sets
from ropelab.eval.lm.perplexity import perplexity
from ropelab.eval.reporting.stats import Cell
from helpers.reference import ContextFree


def test_crossing_interpolates_in_log_length():
    # ln 1.05 = 0.04879 is crossed between 256 (0.02) and 512 (0.06): 2^(8 + 0.7198) = 421.6.
    found = crossing([64, 128, 256, 512, 1024], [0.3, 0.0, 0.02, 0.06, 0.2], 128)
    assert found == pytest.approx(2 ** (8 + (math.log(1.05) - 0.02) / 0.04), rel=1e-12)
    assert crossing([128, 256], [0.0, 0.01], 128) is None  # never 5% worse
    assert crossing([128, 256], [0.0, 0.1], 128) == pytest.approx(2 ** (7 + math.log(1.05) / 0.1))


def _summary(per_seed_log_ppl: dict[int, list[float]], train_len: int = 128, units: tuple = ()) -> dict:
    """A one-row summary whose cells have the given per-seed mean NLLs (one unit, 100 tokens)."""
    cells = {}
    for n, values in per_seed_log_ppl.items():
        cell = Cell(nll=np.array(values)[:, None] * 100, tokens=np.array([100.0]), seeds=tuple(range(len(values))),
                    units=units)
        cells[n] = {"cell": cell, "train_len": train_len, "ppl": math.exp(np.mean(values))}
    return {"row": cells}


def test_breakdown_points_and_interval_over_seeds():
    s = _summary({128: [4.0, 4.1, 4.2], 256: [4.03, 4.12, 4.21], 512: [4.1, 4.2, 4.3], 1024: [4.4, 4.5, 4.6]})
    found = breakdown(s, "row")
    # Every seed crosses: the value is their geometric mean, the centre of the t-interval.
    seeds = [crossing([256, 512, 1024], [r256, 0.1, 0.4], 128) for r256 in (0.03, 0.02, 0.01)]
    logs = np.log2(seeds)
    half = 4.302652729911275 * logs.std(ddof=1) / math.sqrt(3)  # t(0.975, 2)
    assert found["point"] == pytest.approx(2 ** logs.mean(), rel=1e-12)
    assert (found["low"], found["high"]) == pytest.approx((2 ** (logs.mean() - half), 2 ** (logs.mean() + half)))
    assert found["low"] < found["point"] < found["high"]
    assert found["beyond"] == 0 and "×" in breakdown_text(found)
    split = breakdown(_summary({128: [4.0, 4.1], 2048: [4.01, 4.3]}), "row")  # one seed crosses, one does not
    assert split["beyond"] == 1 and split["low"] is None
    # Mean log-ratio 0.21/2 = 0.105 at 2048: the seeds' mean curve crosses, interpolated from L.
    assert split["point"] == pytest.approx(2 ** (7 + math.log(1.05) / 0.105 * 4), rel=1e-9)
    assert breakdown_text(split).endswith("1 of 2 seeds stay within 5% to 2048")
    flat = breakdown(_summary({128: [4.0, 4.1], 2048: [4.01, 4.11]}), "row")
    assert flat["point"] is None and breakdown_text(flat) == "> 2048"
    mean_flat = breakdown(_summary({128: [4.0, 4.1, 4.0], 2048: [4.0, 4.19, 4.0]}), "row")  # the mean stays within
    assert breakdown_text(mean_flat) == "> 2048 (1 of 3 seeds cross)"


def test_a_breakdown_interval_stops_at_the_training_length():
    # Seeds cross at 2^(7 + ln 1.05 / 0.5) = 137.0 and 2^(8 + ln 1.05 / 0.1 · 3) = 706.1: log2 mean
    # 8.281, half-width 12.706 · 1.673 / √2 = 15.03, so the t-interval reaches down to 2^-6.75
    # tokens; a breakdown lies past L = 128 by definition.
    found = breakdown(_summary({128: [4.0, 4.0], 256: [4.5, 4.0], 2048: [4.6, 4.1]}), "row")
    a, b = 2 ** (7 + math.log(1.05) / 0.5), 2 ** (8 + math.log(1.05) / 0.1 * 3)
    assert found["point"] == pytest.approx(math.sqrt(a * b), rel=1e-9)
    assert found["low"] == 128 and found["high"] > 2 ** 19


def test_a_breakdown_of_identical_seeds_has_no_interval_and_a_narrow_one_stays_visible():
    """Two seeds with the same weights (a fine-tune's step 0) cross at the same length: a
    width-0 t-interval would claim certainty, so the row says they agree; an interval narrower
    than a token keeps a decimal rather than print as "132–132"."""
    same = breakdown(_summary({128: [4.0, 4.0], 256: [4.1, 4.1]}), "row")
    assert same["low"] is None and same["point"] == pytest.approx(2 ** (7 + math.log(1.05) / 0.1))
    assert breakdown_text(same).endswith("its 2 seeds agree exactly (the same weights, as at a fine-tune's step 0): "
                                         "no spread to make an interval from")
    close = breakdown(_summary({128: [4.0, 4.0, 4.0], 256: [4.995, 5.0, 5.005]}), "row")  # 132.4 ± 0.06
    assert round(close["low"]) == round(close["high"]) and close["low"] < close["high"]
    assert breakdown_text(close) == f"{close['point']:.1f} (×1.03 L) ({close['low']:.1f}–{close['high']:.1f})"


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


def test_breakdowns_of_fine_tunes_count_each_parent_once():
    """Four fine-tunes, two of each parent: the interval is over the parents' mean log2
    breakdown lengths (1 df), and the tables give each perplexity cell those units."""
    values = {128: [4.0, 4.0, 4.0, 4.0], 256: [4.03, 4.03, 4.01, 4.01], 512: [4.1, 4.1, 4.1, 4.1],
              1024: [4.4, 4.4, 4.4, 4.4]}
    found = breakdown(_summary(values, units=("a", "a", "b", "b")), "row")
    seeds = [crossing([256, 512, 1024], [r, 0.1, 0.4], 128) for r in (0.03, 0.01)]
    logs = np.log2(seeds)
    half = 12.706204736174705 * logs.std(ddof=1) / math.sqrt(2)  # t(0.975, 1)
    assert found["point"] == pytest.approx(2 ** logs.mean(), rel=1e-12)
    assert found["high"] == pytest.approx(2 ** (logs.mean() + half))
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

