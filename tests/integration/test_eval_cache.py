"""Evaluation work done once: an interrupted evaluation resumes from its journal, cells are
cached by what can change a perplexity and shared by content between runs, scalings with the
same rotary tables are scored (and compared) once."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from helpers.models import tiny_config
from ropelab.configs.schema import EvalConfig
from ropelab.eval.core import evaluation
from ropelab.eval.lm.extrapolation import run_extrapolation
from ropelab.model.transformer import Transformer


def test_an_interrupted_evaluation_resumes_after_its_last_finished_cell(tiny_runs, tmp_path, monkeypatch):
    import shutil

    import ropelab.eval.lm.extrapolation as ex
    ev = EvalConfig(lengths=[16, 32, 64], scalings=["none", "yarn"], protocols=["nonoverlap", "sliding"],
                    max_tokens=1024)
    runs = {name: tmp_path / name / "rope-a" for name in ("whole", "cut")}  # apart: no shared cell store
    for path in runs.values():
        shutil.copytree(tiny_runs / "rope-a", path)
    whole = evaluation.cached_evaluation(ex.EXTRAPOLATION, runs["whole"], lambda cfg: ev, "cpu", lambda *a: None)

    calls, real = [], ex.perplexity

    def dies_on_the_fifth(*args, **kwargs):  # Ctrl-C (or the end of a session) mid-evaluation
        calls.append(args[2])
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(ex, "perplexity", dies_on_the_fifth)
    with pytest.raises(KeyboardInterrupt):
        evaluation.cached_evaluation(ex.EXTRAPOLATION, runs["cut"], lambda cfg: ev, "cpu", lambda *a: None)
    journal = next((runs["cut"] / "eval").glob("*.partial.jsonl"))
    with open(journal, "a") as f:
        f.write('{"cell": "None|cut sh')  # a line the kill left half written
    # Cells: none at 16, 32, 64 (two protocols each), then yarn at 64 (16 and 32 are plain
    # RoPE, copied). Two cells (four perplexities) finished before the fifth call died.
    calls.clear()
    meta, rows, curves = evaluation.cached_evaluation(ex.EXTRAPOLATION, runs["cut"], lambda cfg: ev, "cpu", lambda *a: None)
    assert calls == [64, 64, 64, 64]  # none at 64, then yarn at 64: the finished cells are not redone
    assert [(r["scaling"], r["length"], r["protocol"], r["nll"]) for r in rows] == \
        [(r["scaling"], r["length"], r["protocol"], r["nll"]) for r in whole[1]]
    assert curves == whole[2]
    assert not journal.exists() and journal.with_name(journal.name.replace(".partial.jsonl", ".json")).exists()


def test_a_journal_from_another_checkpoint_is_not_reused(tiny_runs, tmp_path):
    from ropelab.eval.lm.extrapolation import Cells

    path = tmp_path / "j.partial.jsonl"
    cells = Cells(path, "step_000020")
    cells.add("None|c|none|16", [{"nll": 1.0}], None, 2.0)
    assert Cells(path, "step_000020").get("None|c|none|16") is not None
    assert Cells(path, "step_000040").get("None|c|none|16") is None  # the run trained on since
    later = Cells(path, "step_000040")
    assert later.done == {} and Cells(path, "step_000020").done  # kept until the new evaluation has a cell
    later.add("None|c|none|16", [{"nll": 2.0}], None, 1.0)
    assert Cells(path, "step_000020").done == {} and Cells(path, "step_000040").done


def test_the_cache_key_ignores_what_cannot_change_a_perplexity():
    from ropelab.configs.diagnostics import DiagnosticsConfig
    from ropelab.configs.tasks import TaskEvalConfig
    from ropelab.configs.schema import RunConfig
    from ropelab.eval.lm.extrapolation import EXTRAPOLATION

    def cache_key(ev):  # the key naming a run's perplexity cache (eval/core/evaluation.py)
        return EXTRAPOLATION.cache_key(RunConfig(), ev)

    ev = EvalConfig(lengths=[16, 32])
    same = [EvalConfig(lengths=[16, 32], batch_size=3), EvalConfig(lengths=[16, 32], reference="alibi"),
            EvalConfig(lengths=[16, 32], tasks=TaskEvalConfig(samples=7)),
            EvalConfig(lengths=[16, 32], diagnostics=DiagnosticsConfig(enabled=True, windows=3))]
    assert all(cache_key(other) == cache_key(ev) for other in same)
    assert cache_key(EvalConfig(lengths=[16, 64])) != cache_key(ev)
    assert cache_key(EvalConfig(lengths=[16, 32], max_tokens=512)) != cache_key(ev)


def test_scalings_with_the_same_rotary_tables_are_scored_once(tiny_runs, monkeypatch):
    """Dynamic NTK fitted to L is NTK at s = L / L_train (every window is L tokens): scored
    once, and the shared numbers are those of scoring dynamic NTK on its own."""
    import ropelab.eval.lm.extrapolation as ex
    calls, real = [], ex.perplexity

    def counted(model, *args, **kwargs):
        calls.append((model.pos.scaling.type, args[1]))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(ex, "perplexity", counted)
    both = EvalConfig(lengths=[16, 32, 64], scalings=["none", "ntk", "dynamic"], protocols=["nonoverlap"],
                      max_tokens=1024)
    _, rows, curves = ex.evaluate_run(tiny_runs / "rope-a", both)
    assert calls == [("none", 16), ("none", 32), ("none", 64), ("ntk", 64)]  # L_train = 32
    calls.clear()
    alone = dataclasses.replace(both, scalings=["dynamic"])
    _, own_rows, own_curves = ex.evaluate_run(tiny_runs / "rope-a", alone)
    assert calls == [("none", 16), ("none", 32), ("dynamic", 64)]
    shared = {r["length"]: r for r in rows if r["scaling"] == "dynamic"}
    for own in own_rows:
        row = shared[own["length"]]
        assert row["nll"] == own["nll"] and row["unit_nll"] == own["unit_nll"]
        assert (row["scaling_factor"], row["effective_scale"]) == (own["scaling_factor"], own["effective_scale"])
    assert shared[64]["same_as"] == "ntk" and shared[64]["effective_scale"] == 2.0
    assert shared[16]["same_as"] == "none" and shared[16]["scaling_factor"] == 1.0
    (curves,), (own_curves,) = curves.values(), own_curves.values()  # one corpus
    assert curves["dynamic"] == own_curves["dynamic"] == curves["ntk"]
    # Different tables are never shared: YaRN at 2L is scored.
    calls.clear()
    ex.evaluate_run(tiny_runs / "rope-a", dataclasses.replace(both, scalings=["ntk", "yarn"]))
    assert calls == [("none", 16), ("none", 32), ("ntk", 64), ("yarn", 64)]


def test_the_report_compares_a_row_identical_to_another_only_once(tiny_runs, tmp_path):
    """Dynamic NTK equals NTK bit for bit here: both rows are shown, the note says why, and
    only NTK is compared; a row that differs in a single unit is never folded."""
    from ropelab.eval.reporting.tables import identical_rows

    ev = EvalConfig(lengths=[16, 32, 64], scalings=["none", "ntk", "dynamic", "yarn", "linear"],
                    protocols=["nonoverlap"], max_tokens=1024)
    out = tmp_path / "report"
    results = run_extrapolation([tiny_runs / "rope-a", tiny_runs / "rope-b"], out, lambda cfg: ev)
    report = (out / "report.md").read_text()
    assert "| rope + dynamic |" in report and "| rope + ntk |" in report  # both rows in the tables
    # Every scaling is compared with every other, PI (named so) too.
    assert "| rope + linear (PI) vs rope |" in report and "| rope + linear (PI) vs rope + ntk |" in report
    assert ("`rope + dynamic` equals `rope + ntk` bit for bit at every length (dynamic NTK fitted to a window "
            "of exactly L_eval tokens is NTK") in report
    assert "| rope + ntk vs rope |" in report and "| rope + ntk vs rope + yarn |" in report
    assert "rope + dynamic vs" not in report and "vs rope + dynamic" not in report
    corpus = results["results"][0]["corpus"]
    labels = ["rope", "rope + ntk", "rope + yarn", "rope + dynamic"]
    assert identical_rows(results, corpus, "nonoverlap", labels) == {"rope + dynamic": "rope + ntk"}
    changed = json.loads(json.dumps(results))
    row = next(r for r in changed["results"] if r["scaling"] == "dynamic" and r["length"] == 64)
    row["unit_nll"][-1] += 1e-9
    assert identical_rows(changed, corpus, "nonoverlap", labels) == {}


def test_cells_are_shared_by_content_between_runs_and_configs(tiny_runs, tmp_path, monkeypatch):
    """Runs in one directory with the same weights (step 0 of fine-tunes from one parent)
    score a cell once; a new evaluation config computes only its new cells; other weights
    score their own."""
    import shutil

    import ropelab.eval.lm.extrapolation as ex
    grid = tmp_path / "grid"
    for name, source in (("a", "rope-a"), ("b", "rope-a"), ("c", "rope-b")):
        shutil.copytree(tiny_runs / source, grid / name, ignore=shutil.ignore_patterns("eval"))
    calls, real = [], ex.perplexity

    def counted(model, *args, **kwargs):
        calls.append(args[1])
        return real(model, *args, **kwargs)

    monkeypatch.setattr(ex, "perplexity", counted)
    ev = EvalConfig(lengths=[16, 32], scalings=["none", "yarn"], protocols=["nonoverlap", "sliding"], max_tokens=1024)
    quiet = lambda *a: None  # noqa: E731
    meta_a, rows_a, curves_a = evaluation.cached_evaluation(ex.EXTRAPOLATION, grid / "a", lambda cfg: ev, "cpu", quiet)
    assert calls == [16, 16, 32, 32]  # yarn is plain RoPE up to L = 32: shared within the run
    calls.clear()
    meta_b, rows_b, curves_b = evaluation.cached_evaluation(ex.EXTRAPOLATION, grid / "b", lambda cfg: ev, "cpu", quiet)
    assert calls == []  # the same weights and tokens: every cell from the store
    assert [{**r, "run": None, "name": None} for r in rows_b] == [{**r, "run": None, "name": None} for r in rows_a]
    assert curves_b == curves_a and {r["run"] for r in rows_b} == {meta_b["run"]} != {meta_a["run"]}
    calls.clear()
    wider = dataclasses.replace(ev, lengths=[16, 32, 64])
    _, rows, curves = evaluation.cached_evaluation(ex.EXTRAPOLATION, grid / "a", lambda cfg: wider, "cpu", quiet)
    assert calls == [64, 64, 64, 64]  # one more length (none, then yarn at 2L): only its cells are new
    assert [r["nll"] for r in rows if r["length"] <= 32] == [r["nll"] for r in rows_a]
    (curve_corpus,) = curves.values()
    assert curve_corpus["none"]["edges"][-1] == 65  # the curve moved to the longest length
    calls.clear()
    evaluation.cached_evaluation(ex.EXTRAPOLATION, grid / "c", lambda cfg: ev, "cpu", quiet)
    assert calls == [16, 16, 32, 32]  # other weights (another seed) are scored
    assert len(list((grid / ".eval-cells").glob("*.json"))) == 2 + 1 + 1 + 2  # a: 16, 32; 64 none, yarn; c

    # Cells scored by uncommitted code are reused by an evaluation from such a tree, never by
    # a clean one: a result from committed code does not inherit the other's provenance.
    shutil.copytree(tiny_runs / "rope-a", grid / "d", ignore=shutil.ignore_patterns("eval"))
    shutil.copytree(tiny_runs / "rope-a", grid / "e", ignore=shutil.ignore_patterns("eval"))
    shutil.rmtree(grid / ".eval-cells")
    calls.clear()
    monkeypatch.setattr(ex, "git_commit", lambda: "d" * 40 + "-dirty")
    evaluation.cached_evaluation(ex.EXTRAPOLATION, grid / "d", lambda cfg: ev, "cpu", quiet)
    assert calls == [16, 16, 32, 32]
    calls.clear()
    evaluation.cached_evaluation(ex.EXTRAPOLATION, grid / "b", lambda cfg: wider, "cpu", quiet)
    assert calls == [64, 64, 64, 64]  # 16 and 32 from d's cells, both trees changed; 64 is new
    calls.clear()
    monkeypatch.setattr(ex, "git_commit", lambda: "d" * 40)
    _, rows_e, _ = evaluation.cached_evaluation(ex.EXTRAPOLATION, grid / "e", lambda cfg: ev, "cpu", quiet)
    assert calls == [16, 16, 32, 32] and {r["eval_commit"] for r in rows_e} == {"d" * 40}


def test_weights_digest_covers_every_encoding_and_every_weight():
    """Every encoding's state dict can be digested (FIRE has a 0-dim parameter), and the digest
    changes with any weight and only with the weights."""
    from ropelab.eval.core.cell_cache import weights_digest

    for kind in ("rope", "sinusoidal", "learned", "alibi", "none", "t5", "kerple", "fire", "xpos"):
        torch.manual_seed(0)
        model = Transformer(tiny_config(kind))
        digest = weights_digest(model)
        torch.manual_seed(0)
        assert weights_digest(Transformer(tiny_config(kind))) == digest, kind
        name, last = list(model.state_dict().items())[-1]
        with torch.no_grad():
            last.reshape(-1)[0] += 1.0
        assert weights_digest(model) != digest, (kind, name)
