"""Evaluation windows: spread budgets, documents, and windows that stay inside documents."""

from __future__ import annotations

import numpy as np

from data.samplers import document_spans, document_windows, eval_windows, spread_windows

EOT = 99


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
