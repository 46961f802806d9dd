"""Evaluating on any corpus with the run's own tokenizer, within documents, and bad inputs."""

from __future__ import annotations

import json
import signal

import pytest

from ropelab import train
from helpers.runs import copy_runs, stop_after, write_run_config
from ropelab.eval.lm.extrapolation import main as extrapolation

BOOK = "It was a dark and stormy night; the rain fell in torrents. " * 12  # ~700 bytes


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_runs):
    return copy_runs(tiny_runs, ["rope-a"], tmp_path_factory.mktemp("evalrun"))[0]


def results(out):
    return json.loads((out / "results.json").read_text())


def test_local_files_within_documents(run_dir, tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    for i in range(3):
        (books / f"book{i}.txt").write_text(BOOK * (i + 1))
    (books / "short.txt").write_text("A short tale of a mouse and a cheese, told quickly.")  # 51 bytes
    out = tmp_path / "r"
    assert extrapolation([str(run_dir), "--data", str(books), "--within-document", "--lengths", "32", "256",
                          "--protocols", "nonoverlap", "--all-tokens", "--out", str(out)]) == 0
    saved = results(out)
    rows = {r["length"]: r for r in saved["results"]}
    assert rows[32]["corpus"] == "books" and rows[32]["within_document"]
    assert rows[32]["documents"] == 4 and rows[32]["skipped_documents"] == 0
    assert rows[256]["documents"] == 3 and rows[256]["skipped_documents"] == 1  # the short tale is skipped
    # Within each book (byte tokens: one per character, + end of text) windows never cross
    # into the next one: 700·k bytes hold (700·k + 1 − 1) // 256 windows of 256.
    sizes = [len(BOOK) * k for k in (1, 2, 3)]
    assert rows[256]["windows"] == sum(n // 256 for n in sizes)
    assert rows[256]["tokens"] == 256 * rows[256]["windows"]
    shared = saved["window_sets"][rows[256]["window_set"]]
    assert shared["unit_kind"] == "documents" and len(shared["unit_tokens"]) == 3  # each book one unit
    report = (out / "report.md").read_text()
    assert "## books" in report and "Windows stay inside documents." in report
    assert "1 shorter documents skipped" in report


@pytest.mark.parametrize("setup,args,message", [
    ("missing", ["--data", "{tmp}/nowhere.txt"], "does not exist"),
    ("empty", ["--data", "{tmp}/empty.txt"], "has no documents"),
    ("short", ["--data", "{tmp}/short.txt", "--within-document", "--lengths", "64"], "no document holds a window"),
    ("none", ["--within-document"], "describe a --data corpus"),
    ("none", ["--max-tokens", "0"], "--max-tokens: must be a positive integer"),
    ("none", ["--lengths", "0"], "--lengths: must be a positive integer"),
])
def test_bad_corpora_are_refused_without_traceback(run_dir, tmp_path, capsys, setup, args, message):
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "short.txt").write_text("Only a few words.\n")
    out = tmp_path / "r"
    try:
        code = extrapolation([str(run_dir), *[a.format(tmp=tmp_path) for a in args], "--out", str(out)])
    except SystemExit as e:  # argparse's usage error for a number out of range
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (out / "results.json").exists()


def test_a_char_tokenizer_that_cannot_encode_the_corpus(tmp_path, corpus, capsys):
    cfg = str(write_run_config(tmp_path, corpus))
    assert train.main([cfg, "train.max_steps=4", "data.tokenizer.kind=char"]) == 0
    (tmp_path / "other.txt").write_text("Zebra quartz: ☕ unseen characters.\n")
    code = extrapolation([str(tmp_path / "runs" / "tiny"), "--data", str(tmp_path / "other.txt"),
                          "--lengths", "8", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "not in this char tokenizer's vocabulary" in err and "Traceback" not in err


def test_an_unfinished_run_is_refused_unless_asked(tmp_path, corpus, capsys, monkeypatch):
    cfg = str(write_run_config(tmp_path, corpus))
    stop_after(5, monkeypatch)
    assert train.main([cfg, "train.max_steps=10"]) == 128 + signal.SIGTERM
    monkeypatch.undo()
    run = str(tmp_path / "runs" / "tiny")
    common = ["--lengths", "16", "--max-tokens", "256", "--no-per-position"]
    assert extrapolation([run, *common, "--out", str(tmp_path / "a")]) == 2
    assert "not finished (its latest checkpoint is step 5 of 10)" in capsys.readouterr().err
    assert extrapolation([run, *common, "--allow-unfinished", "--out", str(tmp_path / "b")]) == 0
