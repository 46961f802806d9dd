"""Requests to evaluate, diagnose, sample or export that contradict themselves or the runs they
name, or that cannot fit in memory: each is refused before any work (exit 2, the
contradiction or the estimate and the limit named, no report written), and the advice of
each message, followed, gives a command that works.

Memory limits are made deterministic by pointing training/memory.py at a /proc/meminfo of
the test's own (``limit_memory``); one case per class runs the real command line with a
request no machine could hold.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest

from ropelab import train
from helpers.bad_input import (cli, limit_memory, overflow_weights, refused, refused_in_process, rewrite_latest_weights,
                               snapshot)
from helpers.runs import write_run_config
from ropelab.eval.lm import extrapolation
from ropelab.eval.tasks import exact_match
from ropelab.scripts import bench
from ropelab.scripts import diagnose
from ropelab.scripts import export_hf
from ropelab.scripts import sample
from helpers import ROOT


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus) -> dict[str, Path]:
    """Tiny finished runs: rope, alibi, and a learned table of 32 positions."""
    tmp = tmp_path_factory.mktemp("eval-requests")
    cfg = write_run_config(tmp, corpus)
    for name, extra in (("rope", []), ("alibi", ["model.pos.kind=alibi"]),
                        ("learned", ["model.pos.kind=learned", "model.pos.max_len=32"])):
        assert train.main([str(cfg), f"name={name}", "train.max_steps=10", *extra]) == 0
    return {name: tmp / "runs" / name for name in ("rope", "alibi", "learned")}


def perplexity(*args: str, out: Path) -> list[str]:
    return [*args, "--max-tokens", "300", "--out", str(out)]


# --------------------------------------------------------------- runs given twice

def test_a_run_given_twice_on_the_command_line(runs, tmp_path):
    rope = str(runs["rope"])
    refused(cli("-m", "ropelab.eval.lm.extrapolation", rope, rope + "/", "--lengths", "32", "--out", str(tmp_path / "r")),
            "is given twice", "each run counts once")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("main, argv", [
    (exact_match.main, ["--lengths", "256", "--samples", "1", "--depths", "0.5"]),
    (diagnose.main, ["--lengths", "32", "--windows", "1"]),
], ids=["eval.tasks", "diagnose"])
def test_a_run_given_twice_to_every_evaluation(runs, tmp_path, capsys, main, argv):
    rope = runs["rope"]
    refused_in_process(main, [str(rope), str(rope.parent / ".." / rope.parent.name / rope.name), *argv,
                              "--out", str(tmp_path / "r")], capsys, "is given twice", "give it once")
    assert not (tmp_path / "r").exists()
    assert main([str(rope), *argv, "--out", str(tmp_path / "r")]) == 0


def test_a_copy_of_a_run_is_not_a_second_seed(runs, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(runs["rope"], copy)
    refused_in_process(extrapolation.main, perplexity(str(runs["rope"]), str(copy), "--lengths", "32",
                                                      out=tmp_path / "r"), capsys,
                       "are the same training", "give one of them")
    assert not (tmp_path / "r").exists()
    assert extrapolation.main(perplexity(str(copy), "--lengths", "32", out=tmp_path / "r")) == 0  # the advice


# --------------------------------------------------------------- a report directory of another kind

# Each report writer: its main, the arguments that score the rope run quickly, and its command.
WRITERS = {"perplexity": (extrapolation.main, ["--lengths", "32", "--max-tokens", "300"], "ropelab eval"),
           "task": (exact_match.main, ["--lengths", "256", "--samples", "1", "--depths", "0.5"], "ropelab tasks"),
           "diagnostics": (diagnose.main, ["--lengths", "32", "--windows", "1"], "ropelab diagnose")}


@pytest.fixture(scope="module")
def reports(runs, tmp_path_factory) -> dict[str, Path]:
    """A report of each kind of the rope run, each in a directory of its own."""
    tmp = tmp_path_factory.mktemp("reports")
    for kind, (main, argv, _) in WRITERS.items():
        assert main([str(runs["rope"]), *argv, "--out", str(tmp / kind)]) == 0
    return {kind: tmp / kind for kind in WRITERS}


@pytest.mark.parametrize("writer, there", [(w, t) for w in WRITERS for t in WRITERS if w != t])
def test_a_report_never_replaces_another_kind_of_report(runs, reports, capsys, writer, there):
    """Each used to exit 0 and write its report.md and results.json over the other's, beside the
    other's figures."""
    main, argv, _ = WRITERS[writer]
    before = snapshot(reports[there])
    refused_in_process(main, [str(runs["rope"]), *argv, "--out", str(reports[there])], capsys,
                       f"holds a {there} report, written by `{WRITERS[there][2]}`", "give another directory")
    assert snapshot(reports[there]) == before


def test_a_report_replaces_a_report_of_its_own_kind(runs, reports, tmp_path):
    for kind, (main, argv, _) in WRITERS.items():
        mine = shutil.copytree(reports[kind], tmp_path / kind)
        assert main([str(runs["rope"]), *argv, "--out", str(mine)]) == 0


def test_a_grid_report_directory_takes_only_the_perplexity_report(runs, reports, tmp_path):
    """A grid's report directory holds its task report in tasks/: pointed at the grid's, the task
    command is refused on the command line too, naming the tool that wrote what is there."""
    grid_report = shutil.copytree(reports["perplexity"], tmp_path / "report")
    shutil.copytree(reports["task"], grid_report / "tasks")
    main, argv, _ = WRITERS["task"]
    refused(cli("-m", "ropelab.eval.tasks.exact_match", str(runs["rope"]), *argv, "--out", str(grid_report)),
            "holds a perplexity report, written by `ropelab eval`")
    refused(cli("-m", "ropelab.eval.lm.extrapolation", str(runs["rope"]), *WRITERS["perplexity"][1],
                "--out", str(grid_report / "tasks")), "holds a task report, written by `ropelab tasks`")
    assert main([str(runs["rope"]), *argv, "--out", str(grid_report / "tasks")]) == 0


def test_a_run_directory_as_the_report_directory(runs, capsys):
    for main, argv, _ in WRITERS.values():
        before = snapshot(runs["alibi"])
        refused_in_process(main, [str(runs["rope"]), *argv, "--out", str(runs["alibi"])], capsys,
                           f"--out {runs['alibi']} is a run directory")
        assert snapshot(runs["alibi"]) == before


# --------------------------------------------------------------- a damaged evaluation cache

@pytest.mark.parametrize("damage", [b'{"rows": [', gzip.compress(b"not json"), b"[]"],
                         ids=["cut-short", "gzip-not-json", "json-of-another-shape"])
def test_a_damaged_evaluation_cache_says_delete_it(runs, tmp_path, capsys, damage):
    """A cache cut short, or whole but not a cache's JSON, was a JSONDecodeError (or a
    UnicodeDecodeError, a KeyError) with a traceback."""
    run = tmp_path / "rope"
    shutil.copytree(runs["rope"], run)
    assert extrapolation.main(perplexity(str(run), "--lengths", "32", out=tmp_path / "r")) == 0
    cache = next((run / "eval").glob("extrapolation-*.json"))
    cache.write_bytes(damage)
    capsys.readouterr()
    err = refused_in_process(extrapolation.main, perplexity(str(run), "--lengths", "32", out=tmp_path / "r"), capsys,
                             f"error: the evaluation cache {cache} is damaged", "delete it, and the run is evaluated "
                             "again from its checkpoint")
    assert err.count("\n") == 1
    cache.unlink()  # the advice, followed
    assert extrapolation.main(perplexity(str(run), "--lengths", "32", out=tmp_path / "r")) == 0


# --------------------------------------------------------------- rows trained unalike

def test_rows_trained_to_other_budgets_are_said_to_differ(runs, tmp_path, corpus, capsys):
    """The README's comparison of RoPE trained 600 steps with ALiBi trained 200 (here 10 and 4)
    printed "alibi vs rope +145.4%" without a word that the rows differ in more than their encoding."""
    cfg = write_run_config(tmp_path, corpus)
    assert train.main([str(cfg), "model.pos.kind=alibi", "train.max_steps=4", "name=alibi"]) == 0
    alibi = tmp_path / "runs" / "alibi"
    capsys.readouterr()
    assert extrapolation.main(perplexity(str(runs["rope"]), str(alibi), "--lengths", "32", "64",
                                         out=tmp_path / "r")) == 0
    assert "warning: Not like for like" in capsys.readouterr().err
    report = (tmp_path / "r" / "report.md").read_text()
    note = "`alibi` against `rope`: steps (4 against 10), tokens trained (1,024 against 2,560)"
    assert note in report, report
    assert report.index(note) < report.index("Paired comparisons on the same tokens")
    assert extrapolation.main(perplexity(str(runs["rope"]), str(runs["alibi"]), "--lengths", "32", "64",
                                         out=tmp_path / "alike")) == 0  # trained alike: no note
    assert "Not like for like" not in (tmp_path / "alike" / "report.md").read_text()
    assert "Not like for like" not in capsys.readouterr().err


def test_rows_of_another_shape_are_said_to_differ(runs, tmp_path, corpus):
    cfg = write_run_config(tmp_path, corpus)
    assert train.main([str(cfg), "model.pos.kind=alibi", "train.max_steps=10", "model.d_model=64", "name=wide"]) == 0
    assert extrapolation.main(perplexity(str(runs["rope"]), str(tmp_path / "runs" / "wide"), "--lengths", "32",
                                         out=tmp_path / "r")) == 0
    assert "`alibi` against `rope`: shape (model.d_model 64 against 32)" in (tmp_path / "r" / "report.md").read_text()


# --------------------------------------------------------------- flags that contradict the protocol or the run

def test_a_stride_longer_than_the_window(runs, tmp_path, capsys):
    argv = [str(runs["rope"]), "--lengths", "32", "64", "--protocols", "sliding"]
    refused_in_process(extrapolation.main, perplexity(*argv, "--stride", "48", out=tmp_path / "r"), capsys,
                       "eval.stride=48 (--stride) is longer than the evaluated length 32", "at most 32")
    assert not (tmp_path / "r").exists()
    assert extrapolation.main(perplexity(*argv, "--stride", "32", out=tmp_path / "r")) == 0


def test_a_stride_without_the_sliding_protocol(runs, tmp_path, capsys):
    argv = [str(runs["rope"]), "--lengths", "32", "--stride", "16"]
    refused_in_process(extrapolation.main, perplexity(*argv, out=tmp_path / "r"), capsys,
                       "the sliding protocol's, which this evaluation does not use", "add --protocols sliding")
    assert extrapolation.main(perplexity(*argv, "--protocols", "sliding", out=tmp_path / "r")) == 0


@pytest.mark.parametrize("main, argv", [
    (extrapolation.main, ["--lengths", "64", "--max-tokens", "300"]),
    (exact_match.main, ["--lengths", "256", "--samples", "1", "--depths", "0.5"]),
], ids=["eval.extrapolation", "eval.tasks"])
def test_a_scaling_for_runs_that_take_none(runs, tmp_path, capsys, main, argv):
    """--scaling yarn on an ALiBi run was ignored by evaluation while sample.py refused it."""
    alibi = str(runs["alibi"])
    refused_in_process(main, [alibi, *argv, "--scaling", "yarn", "--factor", "2", "--out", str(tmp_path / "r")],
                       capsys, "--scaling yarn scales RoPE's frequencies, but no run given has any", "drop --scaling")
    assert not (tmp_path / "r").exists()
    assert main([alibi, *argv, "--out", str(tmp_path / "r")]) == 0


def test_a_scaling_for_some_of_the_runs_says_which_take_none(runs, tmp_path, capsys):
    argv = perplexity(str(runs["rope"]), str(runs["alibi"]), "--lengths", "64", "--scaling", "none", "yarn",
                      "--factor", "2", out=tmp_path / "r")
    assert extrapolation.main(argv) == 0
    assert f"note: {runs['alibi']} (pos.kind=alibi) takes no RoPE scaling" in capsys.readouterr().err


def test_a_factor_without_a_scaling_to_use_it(runs, tmp_path, capsys):
    argv = perplexity(str(runs["rope"]), "--lengths", "64", "--scaling", "none", "--factor", "2", out=tmp_path / "r")
    refused_in_process(extrapolation.main, argv, capsys, "--factor sets the factor of a RoPE scaling",
                       "or drop --factor")
    argv.remove("--factor"), argv.remove("2")
    assert extrapolation.main(argv) == 0


def test_a_learned_table_evaluated_only_beyond_its_length(runs, tmp_path, capsys):
    """Was a StopIteration from inside the report."""
    learned = str(runs["learned"])
    refused_in_process(extrapolation.main, perplexity(learned, "--lengths", "64", "128", out=tmp_path / "r"), capsys,
                       f"{learned}: pos.kind=learned has a table of 32 positions", "evaluate lengths up to 32")
    assert not (tmp_path / "r").exists()
    assert extrapolation.main(perplexity(learned, "--lengths", "32", "64", out=tmp_path / "r")) == 0


# --------------------------------------------------------------- memory

def test_task_lengths_no_machine_could_hold(runs, tmp_path):
    """Grew until the kernel's out-of-memory killer ended it (and everything else)."""
    refused(cli("-m", "ropelab.eval.tasks.exact_match", str(runs["rope"]), "--lengths", "10000000000", "--out", str(tmp_path / "r")),
            "scoring rope at length 10,000,000,000", "needs about", "available", "nothing was started",
            "Evaluate shorter lengths (--lengths)")
    assert not (tmp_path / "r").exists()


# (command, what fits, what does not, what the message says), for a 2 GB limit.
MEMORY = {
    "eval.tasks": (exact_match.main, ["--lengths", "256", "--samples", "1", "--depths", "0.5"],
                   ["--lengths", "10000000", "--samples", "1", "--depths", "0.5"], "scoring rope at length 10,000,000"),
    "eval.extrapolation": (extrapolation.main, ["--lengths", "32", "--max-tokens", "300"],
                           ["--lengths", "10000000", "--max-tokens", "300"], "evaluating rope at length 10,000,000"),
    "diagnose": (diagnose.main, ["--lengths", "32", "--windows", "1"], ["--lengths", "100000", "--windows", "1"],
                 "diagnosing rope at length 100,000"),
}


@pytest.mark.parametrize("command", MEMORY)
def test_an_evaluation_that_cannot_fit(runs, tmp_path, capsys, monkeypatch, command):
    main, fits, too_big, says = MEMORY[command]
    limit_memory(monkeypatch, tmp_path, 2e9)
    out = ["--out", str(tmp_path / "r")]
    refused_in_process(main, [str(runs["rope"]), *too_big, *out], capsys, says, "needs about",
                       "but cpu has 2 GB available (MemAvailable in /proc/meminfo); nothing was started")
    assert not (tmp_path / "r").exists()
    assert main([str(runs["rope"]), *fits, *out]) == 0  # shorter lengths, as the message advises


def test_sampling_that_cannot_fit(runs, tmp_path, capsys, monkeypatch):
    limit_memory(monkeypatch, tmp_path, 2e9)
    refused_in_process(sample.main, [str(runs["rope"]), "--max-new-tokens", "100000000"], capsys,
                       "sampling 100,000,000 tokens after a 1-token prompt needs about", "KV cache",
                       "Ask for fewer tokens (--max-new-tokens)")
    assert sample.main([str(runs["rope"]), "--max-new-tokens", "3", "--seed", "0"]) == 0


def test_an_export_check_that_cannot_fit(runs, tmp_path, capsys, monkeypatch):
    """Transformers' eager attention holds every layer's (H, T, T) scores: refused before the
    export is written."""
    pytest.importorskip("transformers")
    limit_memory(monkeypatch, tmp_path, 2e9)
    argv = [str(runs["rope"]), str(tmp_path / "hf"), "--check"]
    refused_in_process(export_hf.main, [*argv, "--check-length", "100000"], capsys,
                       "checking the export over 100,000 tokens needs about", "transformers' forward",
                       "Check a shorter length (--check-length)")
    assert not (tmp_path / "hf").exists()
    assert export_hf.main([*argv, "--check-length", "64"]) == 0


# (flags that cannot fit in 2 GB, what the message says, the advice followed)
BENCH_MEMORY = {
    "decode": (["--sections", "decode", "--decode-lengths", "100000000"],
               "the benchmark's rope generation of 100,000,016 tokens needs about",
               "Give shorter --decode-lengths", ["--sections", "decode", "--decode-lengths", "4"]),
    "eval": (["--sections", "eval", "--eval-multipliers", "10000000"],
             "the benchmark's rope evaluation at 160,000,000 tokens (1 window per forward) needs about",
             "Give smaller --eval-multipliers", ["--sections", "eval", "--eval-multipliers", "2"]),
    "train": (["--sections", "train", "--set", "train.batch_size=1000000"],
              "needs about", "Lower train.batch_size", ["--sections", "train", "--set", "train.batch_size=1"]),
}


@pytest.mark.parametrize("case", BENCH_MEMORY)
def test_a_benchmark_that_cannot_fit(tmp_path, capsys, monkeypatch, case):
    """scripts/bench.py generated, evaluated or trained until the kernel's out-of-memory killer
    ended it; now each section's largest tensor is estimated before any worker starts."""
    too_big, says, fix, advised = BENCH_MEMORY[case]
    limit_memory(monkeypatch, tmp_path, 2e9)
    out = tmp_path / "bench.json"
    tiny = ["--config", str(ROOT / "configs" / "bench.yaml"), "--set", "model.d_model=32", "model.n_layers=1",
            "model.n_heads=2", "data.tokenizer.vocab_size=300", "train.seq_len=16",
            "--kinds", "rope", "--in-process", "--repeats", "1", "--warmup", "0", "--decode-repeats", "1",
            "--eval-tokens", "64", "--eval-repeats", "1", "--out", str(out)]
    refused_in_process(bench.main, [*tiny, *too_big], capsys, says, fix,
                       "but cpu has 2 GB available (MemAvailable in /proc/meminfo); nothing was started")
    assert not out.exists()
    assert bench.main([*tiny, *advised]) == 0


# --------------------------------------------------------------- a forward that overflows

@pytest.mark.parametrize("main, argv, says", [
    (extrapolation.main, ["--lengths", "32", "--max-tokens", "300"], "the loss at length 32 (nonoverlap, scaling none) "
                                                                     "is nan"),
    (exact_match.main, ["--lengths", "256", "--samples", "1", "--depths", "0.5"], "the model's logits at length 256 are "
                                                                            "not finite"),
    (sample.main, ["--max-new-tokens", "3"], "the next-token logits at position 1 are not finite"),
], ids=["eval.extrapolation", "eval.tasks", "sample"])
def test_finite_weights_whose_forward_overflows(runs, tmp_path, capsys, main, argv, says):
    """Scored as ppl=nan and acc=0.000, or a traceback from sampling, before."""
    copy = tmp_path / "run"
    shutil.copytree(runs["rope"], copy, ignore=shutil.ignore_patterns("eval"))  # no cached evaluations
    overflow_weights(copy)
    extra = [] if main is sample.main else ["--out", str(tmp_path / "r")]
    refused_in_process(main, [str(copy), *argv, *extra], capsys, says, "although the model's weights are finite")
    assert not (tmp_path / "r").exists()


def test_attention_that_overflows_is_not_diagnosed(runs, tmp_path, capsys):
    """Entropy, sink mass and distances of NaN probabilities were written into the report."""
    copy = tmp_path / "run"
    shutil.copytree(runs["rope"], copy, ignore=shutil.ignore_patterns("eval"))
    # Finite weights whose second layer's queries and keys overflow: its scores are inf - inf.
    rewrite_latest_weights(copy, lambda tensors: tensors["blocks.1.attn.wqkv.weight"].fill_(3e38))
    refused_in_process(diagnose.main, [str(copy), "--lengths", "32", "--windows", "1", "--out", str(tmp_path / "r")],
                       capsys, "the attention diagnostics", "of layer 1 at length 32 are not finite",
                       "although the model's weights are finite")
    assert not (tmp_path / "r").exists()


def test_a_cached_evaluation_with_non_finite_results_is_done_again(runs, tmp_path):
    """Evaluations cached before NaN models were refused held ppl=nan: they are not reused."""
    copy = tmp_path / "run"
    shutil.copytree(runs["rope"], copy, ignore=shutil.ignore_patterns("eval"))
    argv = perplexity(str(copy), "--lengths", "32", out=tmp_path / "r")
    assert extrapolation.main(argv) == 0
    (cache,) = (copy / "eval").glob("extrapolation-*.json")
    cached = json.loads(cache.read_text())
    cached["rows"] = [{**row, "nll": float("nan"), "ppl": float("nan")} for row in cached["rows"]]
    cache.write_text(json.dumps(cached))
    assert extrapolation.main(argv) == 0
    rows = json.loads((tmp_path / "r" / "results.json").read_text())["results"]
    assert rows and all(math.isfinite(row["ppl"]) for row in rows)
