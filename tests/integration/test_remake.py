"""A report made again from its results.json alone: the same numbers, the current method."""

from __future__ import annotations

import json
import shutil

import pytest

from ropelab.configs.schema import EvalConfig
from ropelab.eval import regenerate
from ropelab.eval.lm.extrapolation import run_extrapolation


@pytest.fixture(scope="module")
def report(tmp_path_factory, tiny_runs):
    from helpers.runs import copy_runs
    tmp = tmp_path_factory.mktemp("remake")
    copy_runs(tiny_runs, ["rope-a", "rope-b"], tmp / "runs")  # the test deletes them
    out = tmp / "report"
    ev = EvalConfig(lengths=[16, 32], max_tokens=512)
    run_extrapolation([tmp / "runs" / "rope-a", tmp / "runs" / "rope-b"], out, lambda c: ev)
    return tmp, out


def test_a_report_is_made_again_from_its_results_alone(report, tmp_path):
    tmp, out = report
    before = json.loads((out / "results.json").read_text())
    assert before["training_curves"]  # kept, so the runs are not needed again
    shutil.rmtree(tmp / "runs")  # the runs are gone
    moved = tmp_path / "copy"
    shutil.copytree(out, moved)
    assert regenerate.main([str(moved / "results.json")]) == 0
    after = json.loads((moved / "results.json").read_text())
    assert after["results"] == before["results"] and after["runs"] == before["runs"]
    text = (moved / "report.md").read_text()
    assert "made again" in text and "![training loss vs tokens](training_loss.png)" in text
    assert (moved / "training_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    body = lambda t: t.split("## Runs", 1)[1]  # noqa: E731  (the header's dates differ)
    assert body(text) == body((out / "report.md").read_text())


def test_an_early_report_made_again_elsewhere_keeps_its_training_figure(report, tmp_path):
    """A results.json written before it kept the training curves, runs gone: made again in its
    own directory or into --out elsewhere, the report links the figure drawn when it was made."""
    tmp, out = report
    early = tmp_path / "early"
    shutil.copytree(out, early)
    results = json.loads((early / "results.json").read_text())
    del results["training_curves"]
    for run in results["runs"]:
        run["run"] = str(tmp_path / "gone" / run["name"])  # the runs are not at hand
    (early / "results.json").write_text(json.dumps(results))
    figure = (early / "training_loss.png").read_bytes()
    for where in (early, tmp_path / "elsewhere"):
        args = [str(early / "results.json")] + ([] if where == early else ["--out", str(where)])
        assert regenerate.main(args) == 0
        text = (where / "report.md").read_text()
        assert "## Training" in text and "when this report was first made" in text
        assert (where / "training_loss.png").read_bytes() == figure
    (early / "training_loss.png").unlink()  # nothing to carry: no section, nothing invented
    assert regenerate.main([str(early / "results.json"), "--out", str(tmp_path / "bare")]) == 0
    assert "## Training" not in (tmp_path / "bare" / "report.md").read_text()
    assert not (tmp_path / "bare" / "training_loss.png").exists()


@pytest.mark.parametrize("content,message", [
    (None, "does not exist"), ("{", "cannot be read"), ('{"a": 1}', "not a report's results.json")])
def test_bad_results_are_one_line_errors(tmp_path, capsys, content, message):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    assert regenerate.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err


def test_a_report_opens_with_its_summary_and_prints_no_empty_section_or_table_twice(report):
    """The summary (a table, then one sentence per finding) comes first; a correction over no
    comparisons, a power table with no entry, and a table printed twice have no place."""
    _, out = report
    text = (out / "report.md").read_text()
    assert text.index("## Summary") < text.index("## How to read this report") < text.index("## Runs")
    assert "`ropelab regenerate " in text.split("## Summary")[0]  # the one command that remakes it
    assert " 0 comparisons" not in text and " 0 tests" not in text
    tables, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
        elif block:
            tables.append("\n".join(block))
            block = []
    summary_table = tables[0]  # the summary restates the headline cells of one corpus and protocol
    assert len(set(tables[1:])) == len(tables[1:]) and summary_table.startswith("| row | seeds | ppl at")
    power = [t for t in tables if "·" in t]
    assert all(any(c.strip() not in ("–", "") for c in row.split("|")[2:]) for t in power for row in t.splitlines()[2:])


@pytest.mark.slow  # trains two task grids: about 15 s on 2 quiet cores; CI runs it (-m slow)
def test_a_reference_row_a_task_report_lacks_is_warned_with_its_rows(tmp_path, capsys):
    """--reference naming no row warned with the valid rows on perplexity reports only: a task
    report was written without comparisons and without a word."""
    from helpers import ROOT
    committed = ROOT / "docs" / "results" / "length-generalization-tasks-cpu" / "tasks" / "results.json"
    assert regenerate.main([str(committed), "--reference", "nosuchrow", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "warning: the reference row 'nosuchrow' (eval.reference, --reference) is none of the task report's " \
           "rows" in err and "rows: alibi, cope, fire, kerple, learned, nope, rope, sinusoidal, t5, xpos." in err
    assert regenerate.main([str(committed), "--reference", "alibi", "--out", str(tmp_path / "a")]) == 0
    assert "warning" not in capsys.readouterr().err
