"""Evaluation: perplexity by hand, protocols, per-position loss, reports with n/a cells."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import train
from conftest import tiny_config, write_run_config
from data.tokenizers import ByteTokenizer
from configs.schema import EvalConfig
from eval.extrapolation import run_extrapolation, scaling_for
from eval.perplexity import per_position_loss, perplexity, validation_loss
from eval.report import summarize
from model.transformer import Transformer


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
    assert validation_loss(model, tokens, 64, 5, max_windows=4) == pytest.approx(
        float(manual_nll(model, tokens, 64, [0, 64, 128, 192]).mean()), rel=1e-6)


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
    curve = per_position_loss(model, tokens, 100, batch_size=4)
    assert curve.shape == (100,)
    nll = manual_nll(model, tokens, 100, range(0, 900, 100)).view(9, 100)
    assert np.allclose(curve, nll.mean(dim=0).numpy(), rtol=1e-6)
    assert curve.mean() == pytest.approx(perplexity(model, tokens, 100).nll, rel=1e-6)


def test_scaling_factor_follows_the_length():
    assert scaling_for("yarn", 128, 128, None) is None  # in distribution: plain RoPE
    s = scaling_for("yarn", 512, 128, None)
    assert (s.type, s.factor, s.original_max_len) == ("yarn", 4.0, 128)
    assert scaling_for("linear", 256, 128, 8.0).factor == 8.0
    assert scaling_for("none", 4096, 128, None) is None


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("runs")
    cfg = str(write_run_config(tmp, corpus))
    common = [cfg, "train.max_steps=20", "train.eval_interval=20", "train.ckpt_interval=20"]
    for name, extra in (("rope-a", ["train.seed=1"]), ("rope-b", ["train.seed=2"]),
                        ("learned", ["model.pos.kind=learned", "model.pos.max_len=32"])):
        assert train.main(common + [f"name={name}", *extra]) == 0
    return tmp / "runs"


def test_report_from_tiny_runs(tiny_runs, tmp_path):
    ev = EvalConfig(lengths=[16, 32, 64], scalings=["none", "yarn", "llama3"], protocols=["nonoverlap", "sliding"],
                    max_tokens=2048)
    out = tmp_path / "report"
    results = run_extrapolation([tiny_runs / "rope-a", tiny_runs / "rope-b", tiny_runs / "learned"],
                                out, lambda cfg: ev, log=lambda *a: None)
    report = (out / "report.md").read_text()
    assert "## Non-overlapping windows" in report and "## Sliding window" in report
    assert "n/a (trained table: 32 positions)" in report
    for name in ("ppl_vs_length_nonoverlap.png", "ppl_vs_length_sliding.png", "per_position.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    saved = json.loads((out / "results.json").read_text())
    assert saved["results"] == results["results"]
    run = saved["runs"][0]
    for key in ("encoding", "params", "tokens_trained", "train_len", "seed", "git_commit"):
        assert run[key] is not None, key
    # Two seeds of one config are one row: mean ± std.
    table = summarize(saved["results"], "nonoverlap")
    assert table["rope"][64]["seeds"] == 2 and table["rope"][64]["std"] > 0
    assert "±" in report
    assert "na" in table["learned"][64] and table["learned"][32]["ratio"] == 1.0
    # At the training length a scaling is plain RoPE; beyond it, it changes the result.
    rows = {(r["name"], r["scaling"], r["length"], r["protocol"]): r for r in saved["results"]}
    for scaling in ("yarn", "llama3"):
        assert rows[("rope-a", scaling, 32, "nonoverlap")]["nll"] == rows[("rope-a", "none", 32, "nonoverlap")]["nll"]
        assert rows[("rope-a", scaling, 64, "nonoverlap")]["nll"] != rows[("rope-a", "none", 64, "nonoverlap")]["nll"]
    assert all(r["status"] == "n/a" for r in saved["results"] if r["encoding"] == "learned" and r["length"] == 64)
    assert set(saved["per_position"][str(tiny_runs / "learned")]) == {"none"}
    assert len(saved["per_position"][str(tiny_runs / "learned")]["none"]) == 32


def test_cli_reports_missing_runs_and_errors(tiny_runs, tmp_path, capsys):
    from eval.extrapolation import main
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main([str(tiny_runs / "rope-a"), str(tmp_path / "nope"), "--lengths", "32",
                 "--no-per-position", "--out", str(tmp_path / "r")]) == 0
    assert "Missing runs" in (tmp_path / "r" / "report.md").read_text()


def test_token_bytes_count_utf8(tmp_path):
    from configs.schema import TokenizerConfig
    from data.tokenizers import train_tokenizer

    texts = ["héllo wörld, the cat sat on the mat. " * 30, "naïve café ☕ data " * 30]
    for kind in ("bpe", "byte", "char"):
        tok = train_tokenizer(TokenizerConfig(kind=kind, vocab_size=300, min_frequency=1), texts)
        lengths = tok.token_bytes()
        assert lengths.shape == (tok.vocab_size,) and lengths[tok.eot_id] == 1
        for text in texts:
            assert lengths[tok.encode(text)].sum() == len(text.encode("utf-8")), kind


def test_rescaled_model_equals_a_model_loaded_with_that_scaling(tiny_runs):
    from model.config import RopeScalingConfig
    from training.saved_run import load_run, rescaled

    scaling = RopeScalingConfig(type="yarn", factor=2.0, original_max_len=32)
    run = load_run(tiny_runs / "rope-a")
    x = torch.randint(0, 257, (1, 64))
    with torch.no_grad():
        expected = load_run(tiny_runs / "rope-a", scaling=scaling).model(x)
        assert torch.equal(rescaled(run, scaling)(x), expected)
        assert not torch.equal(run.model(x), expected)


def test_evaluation_uses_the_runs_tokenizer_and_never_retrains_one(tmp_path, corpus, monkeypatch):
    import data.tokenizers
    from eval.extrapolation import evaluate_run

    cfg = str(write_run_config(tmp_path, corpus))
    assert train.main([cfg, "train.max_steps=4", "data.tokenizer.kind=bpe", "data.tokenizer.vocab_size=300",
                       "data.tokenizer.min_frequency=1"]) == 0
    run_dir = tmp_path / "runs" / "tiny"
    ev = EvalConfig(lengths=[32], max_tokens=512, per_position=False)
    first = evaluate_run(run_dir, ev, log=lambda *a: None)[1]

    def no_training(*args, **kwargs):
        raise AssertionError("evaluation retrained a tokenizer")

    monkeypatch.setattr(data.tokenizers, "_train_bpe", no_training)
    import shutil
    shutil.rmtree(tmp_path / "cache")  # neither the training nor the evaluation cache is left
    again = evaluate_run(run_dir, ev, log=lambda *a: None)[1]
    assert [r["nll"] for r in again] == [r["nll"] for r in first]


def test_cli_flags_are_checked_before_any_work(tiny_runs, tmp_path, capsys):
    from eval.extrapolation import main
    assert main([str(tiny_runs / "rope-a"), "--stride", "0", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "eval.stride must be a positive integer" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()
