"""Per-head diagnostics pooled over seeds: each run's own retrieval head and sink ranking
(heads are not aligned across training runs), and the needle's mass by depth."""

import json

import numpy as np
import pytest

from ropelab.data.tasks import Multikey, Passkey, eval_instance, task_tokenizer
from ropelab.data.tasks.base import answer_needles, answer_spans
from ropelab.eval.diagnostics.needle import needle_section
from ropelab.eval.diagnostics.report import pooled_rows

LAYERS, HEADS = 2, 4
FIRST_QUERY = "The same head from the first answer query alone"  # how its table in the report begins


def _run(name: str, seed: int) -> dict:
    return {"run": f"runs/{name}", "name": name, "encoding": "t5", "attention": "softmax", "group": "g",
            "stem": "kind-t5", "seed": seed, "train_len": 64, "epsilon": 0.3}


def _cell(top: tuple[int, int], mass_by_depth: dict[float, float], sink: tuple[int, int], windows: int = 10) -> dict:
    """A per-window cell: the needle on head ``top`` with a depth's mass, background 0.01; a sink on ``sink``."""
    depths = [list(mass_by_depth)[i % len(mass_by_depth)] for i in range(windows)]
    needle = np.full((windows, LAYERS, HEADS), 0.01)
    sinks = np.full((windows, LAYERS, HEADS), 0.02)
    for w, d in enumerate(depths):
        needle[w][top] = mass_by_depth[d] + 0.001 * (w % 3)  # a little spread across windows
        sinks[w][sink] = 0.8 + 0.001 * (w % 3)
    return {"status": "ok", "windows": windows, "per_window": True, "needle_heads": needle.tolist(),
            "needle": needle.mean(axis=(1, 2)).tolist(), "sink_heads": sinks.tolist(),
            "needle_uniform": [0.02] * windows, "needle_depths": depths}


def test_seeds_pool_their_own_retrieval_heads_and_ranked_sinks_not_one_head_index():
    runs = [_run("a", 0), _run("b", 1)]
    # Seed a retrieves with layer 1 head 0, seed b with layer 1 head 3; their sinks sit on other heads.
    cells = {"runs/a": {"64": _cell((1, 0), {0.0: 0.9, 1.0: 0.5}, (0, 1)),
                        "128": _cell((1, 0), {0.0: 0.8, 1.0: 0.2}, (0, 1))},
             "runs/b": {"64": _cell((1, 3), {0.0: 0.9, 1.0: 0.5}, (0, 2)),
                        "128": _cell((1, 3), {0.0: 0.8, 1.0: 0.2}, (0, 2))}}
    [row] = pooled_rows({"runs": runs, "cells": cells})
    top = row["lengths"][64]["needle_top"]
    assert top["across"] == "runs" and top["n"] == 2
    assert top["mean"] == pytest.approx(0.7, abs=0.002)  # the mean of the depths 0.9 and 0.5: each seed's own head
    # Pooling one head index across the seeds would have halved it (head (1, 0) holds 0.7 in one seed, 0.01 in the
    # other), so a row of several runs keeps no pooled head-index array; one run keeps its own.
    assert "needle_heads" not in row["lengths"][64]
    by_depth = row["needle_depth"][128]
    assert by_depth[0.0]["mean"] == pytest.approx(0.8, abs=0.002) and by_depth[1.0]["mean"] == pytest.approx(0.2, abs=0.002)
    assert by_depth[1.0]["n"] == 2 and by_depth[1.0]["high"] < by_depth[0.0]["low"]
    # Ranked within each layer, run by run: both seeds' sinks land in layer 0's first column.
    sinks = np.asarray(row["lengths"][64]["sink_heads"]["mean"])
    assert row["sinks_ranked"] and sinks[0, 0] == pytest.approx(0.801, abs=0.002) and sinks[0, 1:].max() < 0.03


def test_each_runs_retrieval_head_stands_apart_from_the_pooled_row(tmp_path):

    runs = [_run("a", 0), _run("b", 1)]
    # Seed a keeps the far needle (depth 0) at 128; seed b, say one that never learned the task, attends little.
    cells = {"runs/a": {"64": _cell((1, 0), {0.0: 0.9, 1.0: 0.5}, (0, 1)),
                        "128": _cell((1, 0), {0.0: 0.8, 1.0: 0.2}, (0, 1))},
             "runs/b": {"64": _cell((0, 3), {0.0: 0.3, 1.0: 0.1}, (0, 2))}}
    [row] = pooled_rows({"runs": runs, "cells": cells})
    a, b = row["needle_top_runs"]["a"], row["needle_top_runs"]["b"]
    assert a["seed"] == 0 and b["seed"] == 1 and 128 not in b["lengths"]
    assert a["lengths"][64][0] == pytest.approx(0.7, abs=0.002) and a["lengths"][64][1] == (0.0, pytest.approx(0.901, abs=0.002))
    assert a["lengths"][128][1][1] == pytest.approx(0.801, abs=0.002)
    assert b["lengths"][64][0] == pytest.approx(0.2, abs=0.002) and b["lengths"][64][1][1] == pytest.approx(0.301, abs=0.002)
    lines = needle_section([row], [64, 128], tmp_path)  # the report's section on the needle
    assert "| t5 | a | 0 | 0.70 (0.90) | 0.50 (0.80) |" in lines
    assert "| t5 | b | 1 | 0.20 (0.30) | – |" in lines
    old = {name: {n: {k: v for k, v in c.items() if k != "needle_depths"} for n, c in by_len.items()}
           for name, by_len in cells.items()}  # cached before depths were recorded: no far column
    [row] = pooled_rows({"runs": runs, "cells": old})
    assert "| t5 | a | 0 | 0.70 | 0.50 |" in needle_section([row], [64, 128], tmp_path)


def test_the_first_answer_query_is_read_on_each_runs_own_retrieval_head(tmp_path):

    runs = [_run("a", 0), _run("b", 1)]
    cells = {"runs/a": {"64": _cell((1, 0), {0.0: 0.9}, (0, 1))}, "runs/b": {"64": _cell((1, 3), {0.0: 0.9}, (0, 2))}}
    for name, top, first in (("runs/a", (1, 0), 0.6), ("runs/b", (1, 3), 0.2)):
        heads = np.full((10, LAYERS, HEADS), 0.05)
        heads[(slice(None), *top)] = first  # the retrieval head (by the mean over answer queries) at its first query
        heads[0, 0, 2] = 0.99  # another head's first query, on one window: not the retrieval head
        cells[name]["64"]["needle_first_heads"] = heads.tolist()
    [row] = pooled_rows({"runs": runs, "cells": cells})
    first = row["lengths"][64]["needle_first_top"]
    assert first["across"] == "runs" and first["mean"] == pytest.approx(0.4) and first["low"] < 0.2 < 0.6 < first["high"]
    assert "needle_first_heads" not in row["lengths"][64]  # head indices are not pooled across seeds
    lines = needle_section([row], [64], tmp_path)
    assert any(line.startswith(FIRST_QUERY) for line in lines)
    assert any(line.startswith("| t5 | 0.400 [") for line in lines)  # its table: the two seeds' first queries pooled
    assert not any("Not measured" in line for line in lines)
    # Run by run, after the slash: a learned seed and an unlearned one pooled in the row stand apart.
    assert {"| t5 | a | 0 | 0.90 (0.90) / 0.60 |", "| t5 | b | 1 | 0.90 (0.90) / 0.20 |"} <= set(lines)
    # One run's diagnostics cached before the measure existed: the row does not pool the other's alone.
    del cells["runs/b"]["64"]["needle_first_heads"]
    [row] = pooled_rows({"runs": runs, "cells": cells})
    assert "needle_first_top" not in row["lengths"][64] and row["lengths"][64]["needle_top"]["n"] == 2
    lines = needle_section([row], [64], tmp_path)
    assert {"| t5 | a | 0 | 0.90 (0.90) / 0.60 |", "| t5 | b | 1 | 0.90 (0.90) |"} <= set(lines)
    assert not any(line.startswith(FIRST_QUERY) for line in lines)
    other = pooled_rows({"runs": [_run("c", 2) | {"encoding": "alibi", "stem": "kind-alibi"}],
                         "cells": {"runs/c": {"64": _cell((0, 0), {0.0: 0.9}, (0, 1))
                                              | {"needle_first_heads": np.full((10, LAYERS, HEADS), 0.3).tolist()}}}})
    lines = needle_section([row, *other], [64], tmp_path)
    assert "Not measured (diagnostics cached before the first-query measure existed): `t5`." in lines


def test_one_run_keeps_its_head_indices_and_an_old_cache_has_no_depth_table():
    cell = _cell((1, 2), {0.0: 0.9, 0.5: 0.6}, (0, 3))
    old = {k: v for k, v in cell.items() if k != "needle_depths"}  # cached before depths were recorded
    [row] = pooled_rows({"runs": [_run("a", 0)], "cells": {"runs/a": {"64": old}}})
    assert not row["sinks_ranked"] and np.asarray(row["lengths"][64]["sink_heads"]["mean"])[0, 3] > 0.79
    assert row["lengths"][64]["needle_top"]["across"] == "windows" and "needle_depth" not in row
    assert np.asarray(row["lengths"][64]["needle_heads"]["mean"])[1, 2] == pytest.approx(0.75, abs=0.002)
    [row] = pooled_rows({"runs": [_run("a", 0)], "cells": {"runs/a": {"64": cell}}})
    assert row["needle_depth"][64][0.5]["n"] == 5  # one run: the interval is across its windows at that depth


def test_a_passkey_runs_report_gives_the_retrieval_heads_mass_by_depth(tmp_path):
    from ropelab import train
    from ropelab.eval import regenerate
    from ropelab.scripts import diagnose
    from helpers.runs import passkey_config

    assert train.main([str(passkey_config(tmp_path))]) == 0
    out = tmp_path / "report"
    assert diagnose.main([str(tmp_path / "runs" / "syn"), "--lengths", "64", "128", "--windows", "6",
                          "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    cell = results["cells"][results["runs"][0]["run"]]["128"]
    depths = results["runs"][0]["eval"]["tasks"]["depths"] or [0.0, 0.25, 0.5, 0.75, 1.0]
    assert cell["needle_depths"] == [float(depths[i % len(depths)]) for i in range(6)]
    report = (out / "report.md").read_text()
    assert "The retrieval head's mass on the needle by its depth" in report
    table = [line for line in report.splitlines() if line.startswith("| passkey") or line.startswith("| rope")]
    assert any(f"| {depths[0]:g} |" in line for line in table)
    assert regenerate.main([str(out)]) == 0  # made again from results.json alone: the same depth table
    assert "The retrieval head's mass on the needle by its depth" in (out / "report.md").read_text()


def test_a_passkeys_answer_needles_are_its_key_once_or_in_the_papers_wording_twice():
    from ropelab.data.tokenizers import ByteTokenizer
    for task, copies in ((Passkey(task_tokenizer(), distractors=4), 1), (Passkey(ByteTokenizer(), style="text"), 2)):
        for depth in (0.0, 0.5, 1.0):  # the distractor numbers are not the key: not marked
            instance = eval_instance(task, 0, 400, depth, 1)
            needle, key = answer_needles(instance), instance.tokens[instance.answer]
            assert np.array_equal(instance.tokens[needle], np.tile(key, copies)) and not needle[instance.answer].any()


def test_multikey_needles_are_the_asked_values_and_not_the_distractors():
    tok = task_tokenizer()
    for asked in (1, 3):
        task = Multikey(tok, needles=4, asked=asked)
        instance = eval_instance(task, 0, 120, 0.5, 2)
        spans = answer_spans(instance)
        assert len(spans) == asked
        needle = answer_needles(instance)
        assert needle.sum() == 5 * asked and not needle[instance.answer].any()
        text = instance.tokens[:spans[0][0]]
        for start, end in spans:  # each asked value once in the text, marked where it stands
            value = instance.tokens[start:end]
            hits = [i for i in range(len(text) - 4) if np.array_equal(text[i:i + 5], value)]
            assert len(hits) == 1 and needle[hits[0]:hits[0] + 5].all()
        digits = np.isin(text, [tok.encode(str(d))[0] for d in range(10)])
        assert digits.sum() == 5 * 4 and (digits & ~needle[:len(text)]).sum() == 5 * (4 - asked)  # the distractors


def test_a_multikey_run_is_diagnosed_on_its_asked_needles(tmp_path):
    from ropelab import train
    from ropelab.scripts import diagnose
    from helpers.runs import passkey_config

    config = passkey_config(tmp_path)
    config.write_text(config.read_text().replace("tasks: [passkey]", "tasks: [multikey], needles: 3"))
    assert train.main([str(config), "train.seq_len=64"]) == 0
    out = tmp_path / "report"
    assert diagnose.main([str(tmp_path / "runs" / "syn"), "--windows", "5", "--lengths", "64", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    cell = results["cells"][results["runs"][0]["run"]]["64"]
    assert np.asarray(cell["needle_heads"]).shape == (5, 2, 4) and len(cell["needle_depths"]) == 5
    first = np.asarray(cell["needle_first_heads"])
    assert first.shape == (5, 2, 4) and (first >= 0).all() and (first <= 1).all()
    assert not np.allclose(first, cell["needle_heads"])  # one query of the answer's, not their mean
    report = (out / "report.md").read_text()
    assert "## Attention on the needle (passkey, multikey)" in report and 0 < min(cell["needle_uniform"])
    assert "The same head from the first answer query alone" in report
