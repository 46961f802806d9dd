"""scripts/bench_eval.py: both sides evaluate fresh copies of the same runs, and the numbers
of every cell are compared. No timing is asserted."""

from __future__ import annotations

import json
import math

import pytest

from ropelab.bench import eval_ab
from ropelab.scripts import bench_eval


def row(name: str, length: int, ppl: float, protocol: str = "nonoverlap", status: str = "ok") -> dict:
    return {"name": name, "corpus": "valid", "scaling": "none", "length": length, "protocol": protocol,
            "status": status, "ppl": ppl, "nll": math.log(ppl)}


def test_cells_are_matched_by_run_corpus_scaling_length_and_protocol():
    base = {"results": [row("a", 32, 10.0), row("a", 64, 20.0), row("a", 128, 5.0, status="skipped")]}
    this = {"results": [row("a", 64, 20.0 * (1 + 3e-7)), row("a", 32, 10.0), row("a", 64, 30.0, "sliding")]}
    found = eval_ab.compare_cells(base, this)
    assert found["cells"] == 2
    assert found["max_rel_ppl"] == pytest.approx(3e-7, rel=1e-3)
    assert found["max_rel_ppl_cell"] == ["a", "valid", "none", 64, "nonoverlap"]
    assert found["only_this"] == [["a", "valid", "none", 64, "sliding"]] and found["only_base"] == []


def test_the_grids_eval_block_with_changed_keys(tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\neval:\n  lengths: [32, 64]\n  max_tokens: 100000\n")
    assert eval_ab.grid_eval(grid, ["max_tokens=2000", "protocols=[nonoverlap]"]) == {
        "lengths": [32, 64], "max_tokens": 2000, "protocols": ["nonoverlap"]}
    (tmp_path / "none.yaml").write_text("name: g\n")
    with pytest.raises(eval_ab.UserError, match="no eval: block"):
        eval_ab.grid_eval(tmp_path / "none.yaml", [])


@pytest.mark.slow  # two trees evaluated in turn: about 13 s on 2 quiet cores; CI runs it (-m slow)
def test_both_sides_evaluate_the_same_runs_and_agree(tiny_runs, tmp_path, capsys):
    """HEAD against itself: every cell equal, both sides timed, the runs' caches untouched."""
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\neval:\n  lengths: [32, 64]\n  protocols: [nonoverlap, sliding]\n  max_tokens: 400\n")
    before = sorted(p.name for p in (tiny_runs / "rope-a").iterdir())
    out = tmp_path / "bench-eval.json"
    assert bench_eval.main([str(tiny_runs / "rope-a"), str(tiny_runs / "learned"), "--compare", "HEAD",
                            "--grid", str(grid), "--threads", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["compare"]["this"].removesuffix("-dirty") == record["compare"]["base"]
    numbers = record["numbers"]
    # rope-a: 2 lengths × 2 protocols; learned (32 positions): length 32 only.
    assert numbers["cells"] == 6 and numbers["max_rel_ppl"] == 0.0 and not numbers["only_base"]
    assert record["base_s"] > 0 and record["this_s"] > 0 and len(record["rounds"]) == 1
    assert sorted(p.name for p in (tiny_runs / "rope-a").iterdir()) == before
    assert "largest relative difference: perplexity 0.00e+00" in capsys.readouterr().out


def test_a_directory_that_is_not_a_run_is_refused(tmp_path, capsys):
    assert bench_eval.main([str(tmp_path), "--compare", "HEAD", "--grid", str(tmp_path / "g.yaml")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_runs_with_a_key_the_older_code_predates_get_a_hint(tiny_runs, tmp_path, capsys):
    """The base side reads the runs' config.yaml; a key newer than REV fails there, with
    what to do said."""
    from helpers.runs import copy_runs

    (run,) = copy_runs(tiny_runs, ["rope-a"], tmp_path / "runs")
    cfg = run / "config.yaml"
    cfg.write_text(cfg.read_text().replace("model:\n", "model:\n  newer_key: 1\n", 1))
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\neval:\n  lengths: [32]\n  max_tokens: 200\n")
    assert bench_eval.main([str(run), "--compare", "HEAD", "--grid", str(grid), "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "the base side's evaluation failed" in err and "newer_key" in err
    assert "at least as new as the one that trained the runs" in err


def test_a_grid_that_inherits_its_eval_block(tmp_path):
    (tmp_path / "parent.yaml").write_text("name: p\neval:\n  lengths: [32]\n  max_tokens: 500\n")
    (tmp_path / "child.yaml").write_text("inherit: parent.yaml\nname: c\n")
    assert eval_ab.grid_eval(tmp_path / "child.yaml", []) == {"lengths": [32], "max_tokens": 500}
