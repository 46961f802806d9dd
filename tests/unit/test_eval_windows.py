"""Evaluation windows: non-overlapping and sliding layouts, spread budgets, documents,
windows that stay inside documents, and the same-token protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ropelab.common.errors import DataError
from ropelab.data import window_batch
from ropelab.data.samplers import document_spans, document_windows, eval_windows, spread_windows, target_windows
from ropelab.eval.lm.perplexity import perplexity
from helpers.reference import ContextFree

EOT = 99


@pytest.mark.parametrize("n, length", [(1000, 128), (1001, 100), (129, 128), (5000, 7), (300, 1)])
def test_nonoverlap_windows(n, length):
    windows = eval_windows(n, length)
    assert len(windows) == (n - 1) // length
    assert all(w.score_from == 0 and w.length == length for w in windows)
    assert [w.start for w in windows] == [i * length for i in range(len(windows))]
    assert windows[-1].start + length + 1 <= n


@pytest.mark.parametrize("n, length, stride", [(1000, 128, 64), (1000, 100, 30), (129, 128, 5),
                                               (5000, 256, 1), (777, 10, 9), (500, 64, 64)])
def test_sliding_windows_score_every_target_once(n, length, stride):
    windows = eval_windows(n, length, stride)
    counts = np.zeros(n, dtype=int)  # counts[t]: how often target token t was scored
    for w in windows:
        assert w.start >= 0 and w.start + w.length + 1 <= n
        counts[w.start + 1 + w.score_from:w.start + 1 + w.length] += 1
    expected_cover = n - 1 if stride < length else (n - 1) // length * length
    skipped = length - stride  # the split's first targets lack length - stride tokens of context
    assert (counts[: skipped + 1] == 0).all()
    assert (counts[skipped + 1:expected_cover + 1] == 1).all() and counts.sum() == expected_cover - skipped
    # Every scored target has at least length - stride tokens of context.
    assert all(w.score_from >= length - stride for w in windows)


def test_eval_window_prefix_and_too_short_split():
    assert len(eval_windows(10_000, 100, max_windows=7)) == 7
    with pytest.raises(DataError, match=r"has 100 tokens.*length 128"):
        eval_windows(100, 128)


def test_window_batch_builds_shifted_inputs_and_masks():
    tokens = np.arange(50, dtype=np.uint16)
    windows = eval_windows(50, 8, stride=4)
    x, y, mask = window_batch(tokens, windows)
    assert x.shape == y.shape == mask.shape == (len(windows), 8)
    assert torch.equal(x + 1, y) and x.dtype == torch.int64
    assert mask.sum().item() == 49 - 4  # the first 4 targets have too little context
    assert not mask[0, :4].any() and mask[0, 4:].all() and not mask[1, :4].any() and mask[1, 4:].all()


def test_spread_windows_cover_the_whole_split_evenly():
    windows = eval_windows(10_001, 100)  # 100 windows
    picked = spread_windows(windows, 1000)
    assert [w.start for w in picked] == [round(i * 99 / 9) * 100 for i in range(10)]
    assert picked[0].start == 0 and picked[-1].start == 9900  # both ends of the split
    assert sum(w.scored for w in picked) == 1000
    assert spread_windows(windows, None) == windows and spread_windows(windows, 10**9) == windows
    sliding = eval_windows(10_000, 100, stride=50)
    chosen = spread_windows(sliding, 1000)
    assert sum(w.scored for w in chosen) >= 1000 and len(chosen) < len(sliding)
    assert len({w.start for w in chosen}) == len(chosen)  # no window twice


def test_document_spans_end_at_each_end_of_text():
    tokens = np.array([1, 2, EOT, 3, EOT, EOT, 4, 5, 6])  # an empty document, and no final EOT
    assert document_spans(tokens, EOT) == [(0, 2), (3, 4), (6, 8)]


def test_windows_never_cross_a_document_and_short_documents_are_counted():
    docs = [list(range(1, 30)), [1, 2, 3], list(range(1, 12))]  # 29, 3 and 11 tokens
    tokens = np.array([t for doc in docs for t in doc + [EOT]])
    spans = document_spans(tokens, EOT)
    windows, skipped = document_windows(spans, 10)
    assert skipped == 1  # the 3-token document cannot hold a window of 10 (+1 target)
    for w in windows:
        inside = [i for i, (a, b) in enumerate(spans) if a <= w.start and w.start + w.length <= b]
        assert len(inside) == 1, w  # inputs and targets (through the EOT) in one document
    # 29 tokens + EOT: 2 non-overlapping windows (targets 1..20); 11 + EOT: one (targets 1..10).
    assert [(w.start, w.scored) for w in windows] == [(0, 10), (10, 10), (34, 10)]
    sliding, _ = document_windows(spans, 10, stride=5)
    targets = [w.start + t + 1 for w in sliding for t in range(w.score_from, w.length)]
    assert len(targets) == len(set(targets))  # still no target scored twice
    assert all(w.score_from >= 5 for w in sliding)


def _scored_targets(windows) -> list[int]:
    """Absolute positions of the scored targets (target of input i is token i + 1)."""
    return sorted(w.start + 1 + i for w in windows for i in range(w.score_from, w.length))


def test_same_token_windows_score_the_same_targets_at_every_length():
    regions = [(0, 200), (201, 230), (231, 400)]  # the middle one is shorter than the longest window
    by_length = {n: target_windows(regions, n, target=8, longest=64) for n in (8, 16, 32, 64)}
    assert {skipped for _, skipped in by_length.values()} == {1}
    targets = {n: _scored_targets(w) for n, (w, _) in by_length.items()}
    assert all(t == targets[8] for t in targets.values())
    assert len(targets[8]) == len(set(targets[8]))  # no target twice
    for n, (windows, _) in by_length.items():
        for w in windows:
            assert w.length == n and w.scored == 8
            region = next((a, b) for a, b in regions if a <= w.start + w.length - 1 < b + 1)
            # the longest window before the span still lies in its region (inputs and targets)
            assert region[0] <= w.start + w.length - 64 and w.start + w.length <= region[1]
    # Spans tile each usable region's tail: ends at start + 64, + 8, … ≤ end.
    assert [w.start + w.length for w in by_length[64][0]][:3] == [64, 72, 80]
    # A budget picks the same spans at every length (each scores 8 targets).
    picked = {n: spread_windows(w, 40) for n, (w, _) in by_length.items()}
    assert all(_scored_targets(p) == _scored_targets(picked[64]) for p in picked.values())


def test_a_model_that_ignores_context_gets_the_same_perplexity_at_every_length():
    """Under the same-token protocol only the context changes, so a context-free model scores
    the same at every length; non-overlapping windows score other tokens at each length."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (5000,)).numpy()
    model = ContextFree(50)
    same = [perplexity(model, tokens, n, target=(16, 256), max_tokens=1600) for n in (16, 32, 64, 256)]
    assert {r.protocol for r in same} == {"same-tokens"} and {r.tokens for r in same} == {1600}
    assert all(r.ppl == pytest.approx(same[0].ppl, rel=1e-6) for r in same)
    assert all(r.unit_tokens == same[0].unit_tokens for r in same)  # the same units: paired by unit
    other = [perplexity(model, tokens, n, max_tokens=1600).ppl for n in (16, 256)]
    assert other[0] != pytest.approx(other[1], rel=1e-6)


def test_position_bins_split_each_units_sums_by_context_position():
    """Non-overlapping windows: per-unit sums in bins [0,1), [1,2), [2,4), …, [2^k, length) add
    up to the unit sums, and each bin holds exactly the windows' targets at those positions."""
    torch.manual_seed(1)
    tokens = torch.randint(0, 50, (3000,)).numpy()
    tokens[::97] = 49  # document ends, so there are several units
    model = ContextFree(50)
    found = perplexity(model, tokens, 24, eot_id=49)
    assert found.position_edges == [0, 1, 2, 4, 8, 16, 24]
    nll, count = np.array(found.position_unit_nll), np.array(found.position_unit_tokens)
    assert np.allclose(nll.sum(axis=0), found.unit_nll, atol=1e-3)
    assert (count.sum(axis=0) == found.unit_tokens).all()
    assert count.sum(axis=1).tolist() == [found.windows * w for w in (1, 1, 2, 4, 8, 8)]
    x = torch.from_numpy(tokens[:-1][: found.windows * 24].astype(np.int64)).view(-1, 24)
    y = torch.from_numpy(tokens[1:][: found.windows * 24].astype(np.int64)).view(-1, 24)
    by_hand = model(x, targets=y, reduction="none").detach().double()  # (windows, 24)
    assert nll.sum(axis=1)[4] == pytest.approx(float(by_hand[:, 8:16].sum()), rel=1e-6)
    assert perplexity(model, tokens, 24, stride=12).position_edges == []  # sliding: not binned
