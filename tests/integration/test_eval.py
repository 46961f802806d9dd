"""Evaluation: perplexity by hand, protocols, per-position loss, units, reports with n/a cells."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from ropelab import train
from helpers.models import tiny_config
from helpers.runs import write_run_config
from ropelab.data.tokenizers import ByteTokenizer
from ropelab.configs.schema import EvalConfig
from ropelab.eval.lm.extrapolation import run_extrapolation, scale_note, scaling_for
from ropelab.eval.lm.report import write_report
from ropelab.eval.lm.perplexity import curve_edges, perplexity
from ropelab.eval.reporting.tables import summarize
from ropelab.model.transformer import Transformer
from ropelab.training.validation import validation_loss


@pytest.fixture(scope="module")
def model_and_tokens():
    torch.manual_seed(0)
    model = Transformer(tiny_config("alibi")).eval()
    tokens = np.random.default_rng(0).integers(0, 97, size=1000).astype(np.uint16)
    return model, tokens


@torch.no_grad()
def manual_nll(model, tokens, length, starts, score_from=0):
    """Per-target NLL of windows at ``starts``, the slow obvious way."""
    out = []
    for s in starts:
        x = torch.from_numpy(tokens[s:s + length].astype(np.int64))[None]
        y = torch.from_numpy(tokens[s + 1:s + length + 1].astype(np.int64))
        logp = torch.log_softmax(model(x)[0].double(), dim=-1)
        out.append(-logp[torch.arange(length), y][score_from:])
    return torch.cat(out)


def test_perplexity_is_exp_mean_nll_by_hand(model_and_tokens):
    model, tokens = model_and_tokens
    result = perplexity(model, tokens, 64, batch_size=3, token_bytes=ByteTokenizer().token_bytes()[:97])
    nll = manual_nll(model, tokens, 64, range(0, 999 - 63, 64))
    assert result.tokens == len(nll) == (999 // 64) * 64
    assert result.nll == pytest.approx(float(nll.mean()), rel=1e-6)
    assert result.ppl == pytest.approx(math.exp(float(nll.mean())), rel=1e-6)
    assert result.bpb == pytest.approx(float(nll.mean()) / math.log(2), rel=1e-6)  # one byte per token
    # No end-of-text id: one document, so the bootstrap units are blocks of windows, and
    # the per-unit sums add up to the totals.
    assert result.unit_kind == "blocks" and len(result.unit_nll) == 15 and result.documents == 1
    assert sum(result.unit_tokens) == result.tokens and sum(result.unit_bytes) == result.tokens
    assert sum(result.unit_nll) == pytest.approx(float(nll.sum()), rel=1e-6)
    assert validation_loss(model, tokens, 64, 5, max_windows=4) == pytest.approx(
        float(manual_nll(model, tokens, 64, [0, 64, 128, 192]).mean()), rel=1e-6)


def test_units_are_documents_when_there_are_enough(model_and_tokens):
    """With an end-of-text id the units are the documents the scored targets belong to."""
    model, tokens = model_and_tokens
    eot = 96
    tokens = tokens.copy()
    tokens[tokens == eot] = 0
    tokens[17::31] = eot  # 32 documents of 31 tokens
    docs = np.concatenate([[0], np.cumsum(tokens[:-1] == eot)])  # document of each position
    result = perplexity(model, tokens, 32, eot_id=eot)
    scored_docs = np.unique(docs[1:1 + (999 // 32) * 32])
    assert result.unit_kind == "documents" and result.documents == len(scored_docs) >= 20
    nll = manual_nll(model, tokens, 32, range(0, 999 - 31, 32))
    targets = np.arange(1, 1 + len(nll))
    groups = np.searchsorted(scored_docs, docs[targets]) * len(result.unit_nll) // len(scored_docs)
    expected = np.bincount(groups, weights=nll.numpy(), minlength=len(result.unit_nll))
    assert np.allclose(result.unit_nll, expected, atol=1e-3)
    assert result.unit_tokens == np.bincount(groups, minlength=len(result.unit_nll)).tolist()


def test_a_token_budget_spreads_windows_over_the_split(model_and_tokens):
    model, tokens = model_and_tokens
    result = perplexity(model, tokens, 64, max_tokens=256)
    assert (result.tokens, result.windows) == (256, 4)
    starts = [0, 320, 576, 896]  # windows 0, 5, 9, 14 of 15: evenly spread, both ends included
    assert result.nll == pytest.approx(float(manual_nll(model, tokens, 64, starts).mean()), rel=1e-6)


def test_sliding_with_stride_equal_length_is_nonoverlap(model_and_tokens):
    model, tokens = model_and_tokens
    a = perplexity(model, tokens, 50)
    b = perplexity(model, tokens, 50, stride=50)
    assert (a.nll, a.tokens, a.windows) == (b.nll, b.tokens, b.windows)
    sliding = perplexity(model, tokens, 50, stride=10)
    assert sliding.protocol == "sliding" and sliding.tokens == 999 - 40
    # Windows at 0, 10, …, 940 score their last 10 targets (targets 41 … 990); one more
    # window, aligned to the end of the split, scores the 9 targets left (991 … 999).
    nll = torch.cat([manual_nll(model, tokens, 50, range(0, 941, 10), score_from=40),
                     manual_nll(model, tokens, 50, [949], score_from=41)])
    assert len(nll) == sliding.tokens
    assert sliding.nll == pytest.approx(float(nll.mean()), rel=1e-6)


def test_per_position_curve(model_and_tokens):
    model, tokens = model_and_tokens
    result = perplexity(model, tokens, 100, batch_size=4, curve=True)
    curve = result.curve
    nll = manual_nll(model, tokens, 100, range(0, 900, 100)).view(9, 100).double()
    edges = curve_edges(100)
    assert curve["edges"] == edges.tolist() and curve["n"] == 9 and edges[0] == 1 and edges[-1] == 101
    per_window = torch.stack([nll[:, a - 1:b - 1].mean(dim=1) for a, b in zip(edges[:-1], edges[1:])], dim=1)
    assert np.allclose(curve["mean"], per_window.mean(dim=0).numpy(), atol=1e-4)
    assert np.allclose(curve["sd"], per_window.std(dim=0).numpy(), atol=1e-4)
    assert perplexity(model, tokens, 100, stride=50, curve=True).curve is None  # non-overlapping only


def test_scaling_factor_follows_the_length():
    assert scaling_for("yarn", 128, 128, None) is None  # in distribution: plain RoPE
    s = scaling_for("yarn", 512, 128, None)
    assert (s.type, s.factor, s.original_max_len) == ("yarn", 4.0, 128)
    assert scaling_for("linear", 256, 128, 8.0).factor == 8.0
    assert scaling_for("none", 4096, 128, None) is None
    # Dynamic NTK fits itself to the length: factor 1, effective scale L/L0 — never s² − s + 1.
    for length, scale in ((128, 1.0), (256, 2.0), (512, 4.0), (2048, 16.0)):
        assert scale_note("dynamic", length, 128, None) == {"scaling_factor": 1.0, "effective_scale": scale}
        assert scale_note("ntk", length, 128, None)["effective_scale"] == scale
    assert scale_note("dynamic", 512, 128, 2.0) == {"scaling_factor": 2.0, "effective_scale": 7.0}


def test_report_from_tiny_runs(tiny_runs, tmp_path):
    ev = EvalConfig(lengths=[16, 32, 64], scalings=["none", "yarn", "llama3"], protocols=["nonoverlap", "sliding"],
                    max_tokens=2048)
    out = tmp_path / "report"
    results = run_extrapolation([tiny_runs / "rope-a", tiny_runs / "rope-b", tiny_runs / "learned"],
                                out, lambda cfg: ev)
    report = (out / "report.md").read_text()
    assert "### Non-overlapping windows" in report and "### Sliding windows" in report
    assert "n/a (trained table: 32 positions)" in report
    for name in ("ppl_vs_length_0_nonoverlap.png", "ppl_vs_length_0_sliding.png", "per_position_0.png",
                 "paired_vs_length_0_nonoverlap.png", "paired_vs_length_0_sliding.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert "![perplexity relative to rope](paired_vs_length_0_nonoverlap.png)" in report
    # Written again over itself: figures it no longer draws go, files of other names stay.
    (out / "paired_vs_length_7_sliding.png").write_bytes(b"old")
    (out / "position-bias.png").write_bytes(b"kept")
    write_report(results, out)
    assert not (out / "paired_vs_length_7_sliding.png").exists()
    assert (out / "position-bias.png").read_bytes() == b"kept"
    assert (out / "paired_vs_length_0_nonoverlap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "results.json").read_text())
    assert saved["results"] == results["results"]
    run = saved["runs"][0]
    for key in ("encoding", "params", "tokens_trained", "train_len", "seed", "git_commit", "eval"):
        assert run[key] is not None, key
    # Two seeds of one config are one row, with an interval; the corpus is named.
    corpus = saved["results"][0]["corpus"]
    assert corpus == "valid.txt (valid)" and f"## {corpus}" in report
    table = summarize(saved, corpus, "nonoverlap")
    cell = table["rope"][64]
    assert cell["seeds"] == 2 and cell["low"] < cell["ppl"] < cell["high"]
    assert cell["tokens"] == 2048 and "Scored per length: 16: 2,048 tokens in" in report
    assert "na" in table["learned"][64] and "ppl" in table["learned"][32]
    assert "rope + yarn vs rope" in report and "learned vs rope" in report  # paired comparisons
    assert "clean tree" in report or "Runs were trained from" in report
    assert "| yarn | 1 → 1 | 1 → 1 | 2 → 2 |" in report  # what the scaling did at each length
    # At the training length a scaling is plain RoPE; beyond it, it changes the result.
    rows = {(r["name"], r["scaling"], r["length"], r["protocol"]): r for r in saved["results"]}
    for scaling in ("yarn", "llama3"):
        assert rows[("rope-a", scaling, 32, "nonoverlap")]["nll"] == rows[("rope-a", "none", 32, "nonoverlap")]["nll"]
        assert rows[("rope-a", scaling, 64, "nonoverlap")]["nll"] != rows[("rope-a", "none", 64, "nonoverlap")]["nll"]
    assert all(r["status"] == "n/a" for r in saved["results"] if r["encoding"] == "learned" and r["length"] == 64)
    learned_curves = saved["per_position"][str(tiny_runs / "learned")][corpus]
    assert set(learned_curves) == {"none"} and learned_curves["none"]["edges"][-1] == 33  # at its table's 32
    rope_curves = saved["per_position"][str(tiny_runs / "rope-a")][corpus]
    assert set(rope_curves) == {"none", "yarn", "llama3"} and rope_curves["yarn"]["edges"][-1] == 65
    assert rope_curves["yarn"]["mean"] != rope_curves["none"]["mean"]


def test_cli_reports_missing_runs_and_errors(tiny_runs, tmp_path, capsys):
    from ropelab.eval.lm.extrapolation import main
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main([str(tiny_runs / "rope-a"), str(tmp_path / "nope"), "--lengths", "32",
                 "--no-per-position", "--out", str(tmp_path / "r")]) == 0
    assert "Missing runs" in (tmp_path / "r" / "report.md").read_text()


def test_token_bytes_count_utf8(tmp_path):
    from ropelab.configs.schema import TokenizerConfig
    from ropelab.data.tokenizers import train_tokenizer

    texts = ["héllo wörld, the cat sat on the mat. " * 30, "naïve café ☕ data " * 30]
    for kind in ("bpe", "byte", "char"):
        tok = train_tokenizer(TokenizerConfig(kind=kind, vocab_size=300, min_frequency=1), texts)
        lengths = tok.token_bytes()
        assert lengths.shape == (tok.vocab_size,) and lengths[tok.eot_id] == 1
        for text in texts:
            assert lengths[tok.encode(text)].sum() == len(text.encode("utf-8")), kind


def test_rescaled_model_equals_a_model_loaded_with_that_scaling(tiny_runs):
    from ropelab.model.config import RopeScalingConfig
    from ropelab.training.saved_run import load_run, rescaled

    scaling = RopeScalingConfig(type="yarn", factor=2.0, original_max_len=32)
    run = load_run(tiny_runs / "rope-a")
    x = torch.randint(0, 257, (1, 64))
    with torch.no_grad():
        expected = load_run(tiny_runs / "rope-a", scaling=scaling).model(x)
        assert torch.equal(rescaled(run, scaling)(x), expected)
        assert not torch.equal(run.model(x), expected)


def test_evaluation_uses_the_runs_tokenizer_and_never_retrains_one(tmp_path, corpus, monkeypatch):
    import ropelab.data.tokenizers
    from ropelab.eval.lm.extrapolation import evaluate_run

    cfg = str(write_run_config(tmp_path, corpus))
    assert train.main([cfg, "train.max_steps=4", "data.tokenizer.kind=bpe", "data.tokenizer.vocab_size=300",
                       "data.tokenizer.min_frequency=1"]) == 0
    run_dir = tmp_path / "runs" / "tiny"
    ev = EvalConfig(lengths=[32], max_tokens=512, per_position=False)
    first = evaluate_run(run_dir, ev)[1]

    def no_training(*args, **kwargs):
        raise AssertionError("evaluation retrained a tokenizer")

    monkeypatch.setattr(ropelab.data.tokenizers, "_train_bpe", no_training)
    import shutil
    shutil.rmtree(tmp_path / "cache")  # neither the training nor the evaluation cache is left
    again = evaluate_run(run_dir, ev)[1]
    assert [r["nll"] for r in again] == [r["nll"] for r in first]


def test_cli_flags_are_checked_before_any_work(tiny_runs, tmp_path, capsys):
    from ropelab.eval.lm.extrapolation import main
    with pytest.raises(SystemExit) as e:  # argparse's usage error, before any work
        main([str(tiny_runs / "rope-a"), "--stride", "0", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--stride: must be a positive integer" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_provenance_names_every_commit_and_says_whether_each_is_clean():
    from ropelab.eval.reporting.runs_section import provenance
    one = provenance([{"git_commit": "a" * 40}, {"git_commit": "a" * 40}])
    assert one == [f"All 2 runs were trained from commit `{'a' * 12}`, a clean tree."]
    assert provenance([{"git_commit": "a" * 40}]) == [f"The run was trained from commit `{'a' * 12}`, a clean tree."]
    two = provenance([{"git_commit": "a" * 40}, {"git_commit": "b" * 40}])
    assert two == [f"Runs were trained from 2 commits: `{'a' * 18}`, `{'b' * 18}`, each a clean tree."]
    mixed = provenance([{"git_commit": "a" * 40}, {"git_commit": "b" * 40 + "-dirty"}, {}])
    assert mixed[0].startswith("Runs were trained from 3 commits:") and mixed[0].endswith("`unknown`.")
    assert "clean" not in mixed[0]
    assert mixed[1].startswith("**Not reproducible from a clean commit**") and "-dirty" in mixed[1]
    assert "`unknown`" in mixed[1]
    # A run resumed under other code: both commits count, and the run is named with them.
    resumed = provenance([{"name": "r", "git_commit": "b" * 40, "commits": ["a" * 40, "b" * 40]},
                          {"name": "s", "git_commit": "b" * 40, "commits": ["b" * 40]}])
    assert resumed == [f"Runs were trained from 2 commits: `{'a' * 18}`, `{'b' * 18}`, each a clean tree.",
                       f"Resumed under other code (its steps were trained at more than one commit): "
                       f"`r` (`{'a' * 12}` then `{'b' * 12}`)."]


def test_rows_whose_seeds_had_different_schedules_are_named():
    from ropelab.eval.reporting.runs_section import provenance, schedule_lines
    same = [{"name": f"a_seed-{k}", "group": "g", "total_steps": 100, "schedules": [[0, 100]]} for k in range(2)]
    assert schedule_lines(same) == []
    assert schedule_lines([{"name": "old", "group": "g"}]) == []  # a checkpoint before the record: nothing to say
    # A grid raised max_steps: seed 2 is new at 200; seeds 0-1 stopped at competence under 100.
    mixed = same + [{"name": "a_seed-2", "group": "g", "total_steps": 200}]
    lines = schedule_lines(mixed)
    assert len(lines) == 1 and "different learning-rate schedules" in lines[0]
    assert "`a_seed-{0,1}` 100 steps" in lines[0] and "`a_seed-2` 200 steps" in lines[0]
    assert schedule_lines(mixed[:2] + [{**mixed[2], "group": "h"}]) == []  # other rows: nothing pooled
    # An extended run: named with both plans, and its row is mixed with the fresh seeds.
    extended = same + [{"name": "a_seed-2", "group": "g", "total_steps": 200, "schedules": [[0, 100], [100, 200]]}]
    lines = schedule_lines(extended)
    assert len(lines) == 2 and lines[1] == ("Re-planned mid-run (the learning-rate schedule took a new length from the "
                                            "step it had reached): `a_seed-2` (100 steps, re-planned for 200 at "
                                            "step 100).")
    assert lines[1] in provenance([{**r, "git_commit": "a" * 40} for r in extended])


def test_the_reference_row_is_chosen_on_the_command_line_and_a_missing_one_is_said(tiny_runs, tmp_path, capsys):
    from ropelab.eval.lm.extrapolation import main
    runs = [str(tiny_runs / name) for name in ("rope-a", "learned")]
    common = ["--lengths", "16", "32", "--protocols", "nonoverlap", "--max-tokens", "512"]
    assert main([*runs, *common, "--reference", "learned", "--out", str(tmp_path / "a")]) == 0
    report = (tmp_path / "a" / "report.md").read_text()
    assert "| rope vs learned |" in report and "learned vs rope" not in report
    assert "warning" not in capsys.readouterr().err
    assert main([*runs, *common, "--reference", "alibi", "--out", str(tmp_path / "b")]) == 0
    report = (tmp_path / "b" / "report.md").read_text()
    assert "Paired comparisons: none; the reference row `alibi` (eval.reference) is none of these rows" in report
    err = capsys.readouterr().err
    assert "warning: the reference row 'alibi'" in err and "rows: learned, rope" in err


def test_a_one_run_report_says_there_is_nothing_to_compare(tiny_runs, tmp_path):
    ev = EvalConfig(lengths=[16, 32], protocols=["nonoverlap"], max_tokens=512, per_position=False)
    run_extrapolation([tiny_runs / "rope-a"], tmp_path / "r", lambda cfg: ev)
    report = (tmp_path / "r" / "report.md").read_text()
    assert "Paired comparisons: none; `rope` is the only row, so there is nothing to compare." in report
    assert "| comparison |" not in report
    wall = next(line for line in report.splitlines() if line.startswith("Wall time"))
    # Three durations in one unit, whatever unit this machine's speed picks; never "0.00 h".
    found = re.findall(r"(\d+(?:\.\d+)?) (h|min|s)\b", wall)
    assert len(found) == 3 and len({unit for _, unit in found}) == 1 and "0.00 h" not in wall, wall


def test_wall_times_read_in_one_unit_that_is_never_zero():
    from ropelab.eval.reporting.tables import durations

    assert durations(4680, 1800, 6480) == ["1.30 h", "0.50 h", "1.80 h"]
    assert durations(6, 36, 42) == ["0.1 min", "0.6 min", "0.7 min"]  # 0.00 h each, as hours
    assert durations(2, 1, 3) == ["2 s", "1 s", "3 s"]
    assert durations(0, 600, 600) == ["0 h", "0.17 h", "0.17 h"]  # an unrecorded time is no unit's guide
    assert durations(0, 20, 20) == ["0 h", "0.01 h", "0.01 h"]  # nor reads "0.00 h" (a loaded machine's case)
    assert durations(0, 0, 0) == ["0 h", "0 h", "0 h"]


def test_same_token_protocol_context_use_and_breakdown_in_the_report(tiny_runs, tmp_path):
    """The same-token protocol scores the same targets at every length (the same window set,
    every length), and the report adds context use at L and each row's breakdown length."""
    ev = EvalConfig(lengths=[16, 32, 64], protocols=["nonoverlap", "same-tokens"], max_tokens=1024)
    out = tmp_path / "same"
    results = run_extrapolation([tiny_runs / "rope-a", tiny_runs / "rope-b"], out, lambda cfg: ev)
    same = [r for r in results["results"] if r["protocol"] == "same-tokens"]
    assert {r["length"] for r in same} == {16, 32, 64} and len({r["window_set"] for r in same}) == 1
    assert {r["tokens"] for r in same} == {1024} and all(r["eval_commit"] for r in same)
    report = (out / "report.md").read_text()
    assert "### Same target tokens at every length" in report
    assert "### Context use" in report and "| rope | 32 |" in report  # the bins at the row's own L
    assert "### Breakdown length" in report and "(same-tokens protocol" in report
    assert "Degradation: each row's perplexity over its own" in report
    assert "also paired by document" in report  # same tokens at both lengths


def test_settings_a_sweep_did_not_choose_are_ablations_with_their_own_table_and_correction(tiny_runs, tmp_path, capsys):
    """A sweep record (`ropelab tune`'s tuning.json) beside the report: the rows it did not
    choose keep their perplexities but leave the study's comparisons for a table and a
    Benjamini–Hochberg family of their own; a remade report elsewhere keeps the split."""
    from ropelab.eval.lm.extrapolation import main
    from ropelab.eval.regenerate import main as remake

    out = tmp_path / "study"
    out.mkdir()
    record = {"encodings": {"any": {"chosen": "rope-a", "rows": {"rope-a": {}, "learned": {}}}}}
    (out / "tuning.json").write_text(json.dumps(record))
    runs = [str(tiny_runs / name) for name in ("rope-a", "rope-b", "learned")]
    common = ["--lengths", "16", "32", "--protocols", "nonoverlap", "--max-tokens", "512", "--no-per-position"]
    assert main([*runs, *common, "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "**Ablations.**" in report and "`learned` (chosen instead: `rope`)" in report
    assert "the seeds added after the choice carry no such selection" in report  # the winner's curse, said
    study, _, ablation = report.partition("Ablations against the reference")
    assert "| learned vs rope |" not in study and "| learned vs rope |" in ablation
    assert "| learned |" in study  # still in the perplexity tables
    assert "Paired comparisons of the study's rows: none; every row but the reference is an ablation." in study
    assert json.loads((out / "results.json").read_text())["ablations"] == {"learned": "rope"}
    assert remake([str(out / "results.json"), "--out", str(tmp_path / "again")]) == 0
    assert "**Ablations.**" in (tmp_path / "again" / "report.md").read_text()
    # A record that is not one is said before anything is evaluated.
    (out / "tuning.json").write_text("{\"encodings\": [1, 2]")
    assert main([*runs, *common, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "tuning.json is not a sweep record that `ropelab tune` wrote" in err and "Traceback" not in err
