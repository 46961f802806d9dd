"""Bad input a user can give, by class: every entry point refuses it with exit code 2 and one
``error: …`` line, never a traceback, and leaves what was there intact.

One case per class runs the real command line in a subprocess; the neighbours of each
class run in-process through the same ``main`` (the same code path, much faster). The
other areas of the suite are tests/integration/test_bad_input_*.py (helpers: tests/helpers/bad_input.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ropelab import train
from helpers.bad_input import cli, refused, refused_in_process
from helpers.runs import write_run_config
from ropelab.common.errors import ArgumentError
from ropelab.eval.core import evaluation as driver
from ropelab.eval.lm import extrapolation
from ropelab.eval.reporting.report_dir import PERPLEXITY, check_report_dir
from ropelab.eval.tasks import exact_match
from ropelab.scripts import export_hf
from ropelab.scripts import sample


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> tuple[Path, Path]:
    """(config, run directory) of a tiny run trained for 10 steps."""
    tmp = tmp_path_factory.mktemp("bad-input")
    cfg = write_run_config(tmp, corpus)
    assert train.main([str(cfg), "train.max_steps=10"]) == 0
    return cfg, tmp / "runs" / "tiny"


# --------------------------------------------------------------------- train.py

def test_train_without_arguments_shows_usage_and_an_example():
    res = cli("train.py")
    refused(res, "usage:", "example")


def test_a_directory_as_config(trained):
    cfg, _ = trained
    refused(cli("train.py", str(cfg.parent)), "is a directory; give a YAML config file")


def test_a_non_finite_config_value(trained):
    cfg, _ = trained
    refused(cli("train.py", str(cfg), "train.lr=.inf"), "train.lr must be a finite number")


@pytest.mark.parametrize("override, fragment", [
    ("train.lr=-.inf", "finite"), ("model.pos.rope.theta=.nan", "finite"),
    ("train.seq_len=0", "train.seq_len must be a positive"), ("train.max_tokens=-5", "max_tokens must be a positive"),
    ("model.pos.rope.scaling.factor=0.5", "must be >= 1"), ("eval.factor=0.5", "eval.factor must be >= 1"),
    ("train.device=gpu", "'gpu' is not a device"), ("data.encoding=klingon", "not a text encoding")])
def test_out_of_range_config_values(trained, capsys, override, fragment):
    cfg, _ = trained
    refused_in_process(train.main, [str(cfg), override, "name=other"], capsys, fragment)


def test_a_device_that_is_not_there(trained, capsys):
    cfg, run = trained
    refused(cli("train.py", str(cfg), "train.device=cuda:99", "name=other"), "train.device=cuda:99")
    refused_in_process(sample.main, [str(run), "--device", "cuda:99"], capsys, "--device=cuda:99")
    refused_in_process(extrapolation.main, [str(run), "--device", "cuda:99"], capsys, "--device=cuda:99")
    if not torch.cuda.is_available():
        refused_in_process(sample.main, [str(run), "--device", "cuda"], capsys, "needs a CUDA GPU")


def test_bad_environment_variables(trained, capsys, monkeypatch):
    cfg, _ = trained
    refused(cli("train.py", str(cfg), "name=other", env={"ROPELAB_PEAK_FLOPS": "fast"}), "ROPELAB_PEAK_FLOPS='fast'")
    monkeypatch.setenv("WORLD_SIZE", "two")
    refused_in_process(train.main, [str(cfg), "name=other"], capsys, "WORLD_SIZE='two'")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("ROPELAB_CACHE", str(cfg))  # a file where the cache directory belongs
    refused_in_process(train.main, [str(cfg), "name=other", "data.cache_dir=null"], capsys, str(cfg))
    assert not (cfg.parent / "runs" / "other").exists()  # a run that never started leaves nothing


def test_resume_of_a_run_that_does_not_exist(trained, capsys):
    cfg, _ = trained
    refused(cli("train.py", str(cfg), "name=ghost", "--resume"), "runs/ghost does not exist", "runs in ", "tiny")
    assert not (cfg.parent / "runs" / "ghost").exists()


def test_paths_of_the_wrong_kind(trained, capsys):
    cfg, run = trained
    a_file = cfg  # any existing file
    refused(cli("train.py", str(cfg), f"out_dir={a_file}"), f"{a_file} is a file")
    refused_in_process(train.main, [str(cfg), f"out_dir={a_file}/runs"], capsys, f"{a_file} is a file")
    refused_in_process(train.main, [str(cfg), f"data.cache_dir={a_file}", "name=other"], capsys, str(a_file))
    refused_in_process(export_hf.main, [str(run), str(a_file)], capsys, f"{a_file} is a file")
    refused_in_process(sample.main, [str(run / "config.yaml")], capsys, "is a file; give the run directory")


def test_an_existing_out_is_refused_before_evaluation(trained, capsys):
    cfg, run = trained
    res = cli("-m", "ropelab.eval.lm.extrapolation", str(run), "--out", str(cfg))
    refused(res, "is a file")
    assert "evaluating" not in res.stdout
    refused_in_process(extrapolation.main, [str(run), "--out", str(cfg.parent)], capsys,
                       "already holds files that are not a report", "nothing was done")
    assert not (cfg.parent / "report.md").exists()


def test_a_report_may_go_beside_the_sweep_record_and_reports_of_its_grid(tmp_path):
    """tune.py's record and the tasks/diagnostics reports may be in a grid's report directory
    before its first report; any other file there is still refused."""
    out = tmp_path / "report"
    (out / "diagnostics").mkdir(parents=True)
    (out / "tasks").mkdir()
    (out / "tuning.md").write_text("# Tuning\n")
    (out / "tuning.json").write_text("{\"encodings\": {}}")
    check_report_dir(out, PERPLEXITY)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ArgumentError, match="already holds files that are not a report"):
        check_report_dir(out, PERPLEXITY)


@pytest.mark.parametrize("argv, fragment", [
    (["--max-new-tokens", "0"], "--max-new-tokens: must be a positive integer"),
    (["--scaling", "yarn", "--factor", "0.5"], "--factor: must be >= 1"),
    (["--top-p", "0"], "--top-p: must be in (0, 1]"),
    (["--temperature", "-1"], "--temperature: must be 0 or more"),
])
def test_numbers_out_of_range_on_the_command_line(trained, capsys, argv, fragment):
    _, run = trained
    with pytest.raises(SystemExit) as e:  # argparse's own usage error
        sample.main([str(run), *argv])
    assert e.value.code == 2 and fragment in capsys.readouterr().err


@pytest.mark.parametrize("evaluation, argv", [(extrapolation.EXTRAPOLATION, argv) for argv in (
    ["--lengths", "0"], ["--max-tokens", "-1"], ["--stride", "0"], ["--batch-size", "0"], ["--factor", "0.5"],
    ["--factor", "inf"], ["--steps", "-1"])] + [(exact_match.TASKS, argv) for argv in (
    ["--lengths", "0"], ["--samples", "0"], ["--kmax-threshold", "2"], ["--steps", "x"])],
    ids=lambda value: " ".join(value) if isinstance(value, list) else value.name)
def test_numbers_out_of_range_for_evaluation(trained, evaluation, argv):
    _, run = trained
    with pytest.raises(SystemExit) as e:
        driver.parse_args(evaluation, [str(run), *argv])
    assert e.value.code == 2


# ------------------------------------------------------------------ files that are not what they should be

def test_a_corpus_that_is_not_utf8(trained, tmp_path, capsys):
    cfg, _ = trained
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"plain text first\n" * 10 + "caf\xe9 ol\xe9\n".encode("latin-1") * 200)
    res = cli("train.py", str(cfg), "name=latin", f"data.local.train=[{latin1}]")
    refused(res, str(latin1), "at byte 173", "data.encoding")
    binary = tmp_path / "random.bin"
    binary.write_bytes(bytes(range(128, 256)) * 50)
    refused_in_process(train.main, [str(cfg), "name=binary", f"data.local.train=[{binary}]"], capsys,
                       str(binary), "at byte 0", "a binary file does not belong")
    assert not (cfg.parent / "runs" / "latin").exists() and not (cfg.parent / "runs" / "binary").exists()


def test_a_tokenizer_that_is_not_the_runs(trained, tmp_path, capsys):
    _, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "tokenizer.json").write_text('{"kind": "char", "chars": ["a", "b"]}')
    refused(cli("scripts/sample.py", str(copy), "--max-new-tokens", "3"), "does not belong to this run")
    refused_in_process(export_hf.main, [str(copy), str(tmp_path / "hf")], capsys, "does not belong to this run")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("content", [b"\x89PNG\x00", b"[1, 2]", b'{"kind": "sentencepiece"}'],
                         ids=["binary", "a-list", "unknown-kind"])
def test_a_tokenizer_file_that_is_no_tokenizer(trained, tmp_path, capsys, content):
    _, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "tokenizer.json").write_bytes(content)
    refused_in_process(sample.main, [str(copy)], capsys, "tokenizer.json")


def test_warmup_as_long_as_the_run_is_warned_about(trained, capsys):
    cfg, _ = trained
    assert train.main([str(cfg), "name=warm", "train.max_steps=2", "train.warmup_steps=5",
                       "train.eval_interval=2", "train.ckpt_interval=2"]) == 0
    assert "warning: train.warmup_steps=5 is not below the run's 2 steps" in capsys.readouterr().err


def test_print_config_prints_the_resolved_config(trained, capsys):
    cfg, _ = trained
    assert train.main([str(cfg), "train.lr=1e-4", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.0001" in out and "seq_len: 32" in out
    assert not (cfg.parent / "runs" / "tiny" / "x").exists()


def test_a_report_names_its_corpus_and_shows_training(trained, tmp_path):
    _, run = trained
    out = tmp_path / "report"
    assert extrapolation.main([str(run), "--lengths", "32", "--max-tokens", "500", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    (settings,) = results["corpora"].values()
    assert settings["split"] == "valid" and settings["protocols"] == ["nonoverlap"] and settings["max_tokens"] == 500
    report = (out / "report.md").read_text()
    assert "split: valid" in report and "training_loss.png" in report and (out / "training_loss.png").is_file()
