"""A grid's archive (scripts/archive.py, training/run_record.py): finished, evaluated runs
kept as records without weights, restored on a fresh clone so the grid carries over."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch

from ropelab import train
from ropelab.common.errors import CheckpointError, ConfigError
from ropelab.configs.grid import load_grid
from helpers.runs import write_grid
from ropelab.scripts import ablate
from ropelab.grid import archive
from ropelab.grid import local
from ropelab.scripts import tune
from ropelab.training.run_dir import RunDir
from ropelab.training.run_record import is_record
from ropelab.training.saved_run import load_run


def kept_grid(tmp: Path, corpus: Path, extra: str = "", archive: str = "archive") -> Path:
    """Two rows of KERPLE (positional lr 1 and 3), one seed, 8 steps, with diagnostics; kept in
    ``tmp/<archive>``, and ``extra`` after."""
    return write_grid(tmp, corpus, name="kept",
                      overrides=["train.max_steps=8", "train.eval_interval=8", "train.ckpt_interval=4",
                                 "model.pos.kind=kerple"],
                      variants={"lr1": [], "lr3": ["train.pos_lr_multiplier=3"]}, axes={"train.seed": [1]},
                      eval={"lengths": [32, 64], "protocols": ["nonoverlap"], "scalings": ["none"], "max_tokens": 512,
                            "diagnostics": {"enabled": True, "windows": 2, "lengths": [32, 64]}},
                      report=tmp / "report", archive=tmp / archive, text=extra)

def archive_bytes(tmp: Path) -> dict:
    return {p.relative_to(tmp / "archive"): p.read_bytes() for p in (tmp / "archive").rglob("*") if p.is_file()}


def report_rows(tmp: Path) -> list[tuple]:
    results = json.loads((tmp / "report" / "results.json").read_text())
    return sorted((r["run"].split("/")[-1], r["length"], r["protocol"], r["nll"]) for r in results["results"])


def test_archived_runs_carry_over_to_a_fresh_clone_without_weights(tmp_path, corpus, capsys):
    grid_path = kept_grid(tmp_path, corpus)
    runs = load_grid(grid_path).plan()
    assert ablate.main([str(grid_path)]) == 0
    out = capsys.readouterr().out
    assert "2/2 runs finished" in out
    rows = report_rows(tmp_path)
    diagnosed = (tmp_path / "report" / "diagnostics" / "results.json").read_text()

    # Each record: the run's config, tokenizer, metrics, final checkpoint metadata and the
    # grid's three evaluations (perplexity, diagnostics), no weights or optimizer state.
    for run in runs:
        record = tmp_path / "archive" / run.name
        files = sorted(str(p.relative_to(record)) for p in record.rglob("*") if p.is_file())
        assert {"config.yaml", "tokenizer.json.gz", "metrics.jsonl.gz", "record.json", "checkpoints/latest",
                "checkpoints/step_000008/meta.json", "eval/planned.yaml"} <= set(files)
        assert sum(f.startswith("eval/extrapolation-") and f.endswith(".json.gz") for f in files) == 1
        assert sum(f.startswith("eval/diagnostics-") and f.endswith(".json.gz") for f in files) == 1
        assert not [f for f in files if f.endswith((".safetensors", ".pt", ".log", ".partial.jsonl"))]
    # Written again from the same run: the same bytes (nothing in a record says when it was written).
    first = archive_bytes(tmp_path)
    for run in runs:
        archive.archive_run(load_grid(grid_path), run)
    assert archive_bytes(tmp_path) == first

    # A fresh clone: no run directories, only the archive. Nothing trains or is evaluated
    # again, and the reports say the same.
    shutil.rmtree(tmp_path / "runs")
    shutil.rmtree(tmp_path / "report")
    assert ablate.main([str(grid_path), "--dry-run", "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert out.count("archived ") == 2 and not (tmp_path / "runs").exists()  # a dry run copies nothing
    assert ablate.main([str(grid_path)]) == 0
    out = capsys.readouterr().out
    assert "restored 2 runs from the grid's archive" in out and out.count("restored from the archive") == 2
    assert "runs archived" not in out  # records are not written again
    for run in runs:  # unpacked as they were
        assert RunDir.of(run.cfg).metrics.read_text().count("val_loss") >= 1
        assert not list(RunDir.of(run.cfg).path.rglob("*.gz"))
    # Perplexity and diagnostics of each come from its record, read by the grid's reports;
    # no process was started to train or evaluate it, so none wrote the run's log.
    assert out.count("reusing") == 2 * len(runs)
    assert not [run.name for run in runs if RunDir.of(run.cfg).log.exists()]
    assert report_rows(tmp_path) == rows
    assert json.loads((tmp_path / "report" / "diagnostics" / "results.json").read_text())["cells"] == \
        json.loads(diagnosed)["cells"]

    # A record cannot be trained further, sampled or evaluated anew: each says why.
    record = RunDir.of(runs[0].cfg)
    assert is_record(record)
    with pytest.raises(CheckpointError, match="is a run record .* train it again"):
        load_run(record.path)
    assert train.main([str(load_grid(grid_path).base), *runs[0].overrides, "train.max_steps=12",
                       "train.resume=auto"]) == 2
    assert "is a run record" in capsys.readouterr().err
    longer = kept_grid(tmp_path, corpus, extra="")
    longer.write_text(longer.read_text().replace("train.max_steps=8", "train.max_steps=12"))
    assert ablate.main([str(longer), "--dry-run", "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert out.count("conflict") == 2 and "is a run record" in out
    other_eval = kept_grid(tmp_path, corpus)
    other_eval.write_text(other_eval.read_text().replace("lengths: [32, 64], protocols",
                                                         "lengths: [32, 48], protocols"))
    # Other eval settings: the records hold no evaluation under them and no weights to score
    # again, which the plan says before anything trains (a dry run too), not the report after.
    assert ablate.main([str(other_eval), "--dry-run", "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert out.count("conflict") == 2
    assert out.count("holds no perplexity evaluation under the grid's eval settings") == 2  # the diagnostics' hold
    assert ablate.main([str(other_eval)]) == 1
    out = capsys.readouterr().out
    assert out.count("failed:") == 2 and f"remove it and its record {tmp_path / 'archive'}" in out and "evaluating" not in out
    away = tmp_path / "away"  # a record taken out of the archive since it was restored here
    shutil.move(tmp_path / "archive" / runs[0].name, away)
    assert ablate.main([str(other_eval), "--dry-run", "--no-estimate"]) == 0
    assert capsys.readouterr().out.count("remove it (the archive no longer holds its record)") == 1
    shutil.move(away, tmp_path / "archive" / runs[0].name)
    fresh = tmp_path / "fresh-clone-runs"  # a dry run on a fresh clone reads the archive's own copies
    other_eval.write_text(other_eval.read_text().replace(str(tmp_path / "runs"), str(fresh)))
    assert ablate.main([str(other_eval), "--dry-run", "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"conflict the record {tmp_path / 'archive'}") == 2 and not fresh.exists()
    assert out.count("holds no perplexity evaluation") == 2 and "archived " not in out
    assert ablate.main([str(kept_grid(tmp_path, corpus)), "--no-estimate"]) == 0  # the settings they hold
    assert "conflict" not in capsys.readouterr().out

    # tune.py reads the records too (their validation loss at L), on a fresh clone as well.
    shutil.rmtree(tmp_path / "runs")
    assert tune.main([str(grid_path), "--out", str(tmp_path / "tuning")]) == 0
    assert "kerple" in (tmp_path / "tuning" / "tuning.md").read_text()

    # A record cut short in the archive (a fresh clone again) is named, and nothing is restored
    # (test_a_damaged_record_is_named_and_nothing_is_restored damages one otherwise).
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)
    damage_a_record(grid_path, runs, "cut-short", capsys)


def damage_a_record(grid_path: Path, runs: list, damage: str, capsys) -> None:
    """Damage the second run's archived perplexity evaluation, with no run directories: the grid
    names the file and restores nothing."""
    damaged = next((grid_path.parent / "archive" / runs[1].name / "eval").glob("extrapolation-*.json.gz"))
    damaged.write_bytes(damaged.read_bytes()[:40] if damage == "cut-short" else gzip.compress(b"not json", mtime=0))
    capsys.readouterr()
    assert ablate.main([str(grid_path), "--no-estimate"]) == 2
    err = capsys.readouterr().err
    assert str(damaged) in err and "the record is damaged" in err and "Traceback" not in err
    assert not RunDir.of(runs[1].cfg).path.exists()  # nothing half-restored


@pytest.mark.slow  # a grid trained for it: about 24 s on 2 quiet cores; CI runs it (-m slow)
def test_a_damaged_record_is_named_and_nothing_is_restored(tmp_path, corpus, capsys):
    """Whole gzip around text that is not JSON (restored, then a JSONDecodeError with a traceback
    when the grid read it): the message of a file cut short (the test above ends with that)."""
    grid_path = kept_grid(tmp_path, corpus)
    assert ablate.main([str(grid_path), "--no-estimate"]) == 0
    runs = load_grid(grid_path).plan()
    shutil.rmtree(tmp_path / "runs")
    damage_a_record(grid_path, runs, "gzip-not-json", capsys)


@pytest.mark.slow  # five passes over a trained grid: about 31 s on 2 quiet cores; CI runs it (-m slow)
def test_a_record_changed_in_the_archive_since_it_was_restored_is_brought_up_to_date(tmp_path, corpus, capsys):
    """A record updated in git (an evaluation scored again) reaches a run directory that holds
    an earlier restore of it: its changed files are written again, a file the archive lacks
    stays, and a damaged archived file changes nothing."""
    grid_path = kept_grid(tmp_path, corpus)
    assert ablate.main([str(grid_path), "--no-estimate"]) == 0
    runs = load_grid(grid_path).plan()
    shutil.rmtree(tmp_path / "runs")
    assert ablate.main([str(grid_path), "--no-estimate"]) == 0  # restores both
    capsys.readouterr()
    archived = next((tmp_path / "archive" / runs[0].name / "eval").glob("extrapolation-*.json.gz"))
    restored = RunDir.of(runs[0].cfg).path / "eval" / archived.name[:-len(".gz")]
    scored_again = json.loads(restored.read_text())
    scored_again["meta"]["note"] = "scored again"
    archived.write_bytes(gzip.compress(json.dumps(scored_again).encode(), mtime=0))
    extra = RunDir.of(runs[0].cfg).path / "eval" / "local-only.json"
    extra.write_text("{}")
    assert ablate.main([str(grid_path), "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert f"brought 1 restored records up to date with the archive (changed since): {runs[0].name}" in out
    assert json.loads(restored.read_text())["meta"]["note"] == "scored again" and extra.exists()
    assert ablate.main([str(grid_path), "--no-estimate"]) == 0
    assert "up to date" not in capsys.readouterr().out  # nothing changed since: nothing written
    archived.write_bytes(archived.read_bytes()[:40])
    assert ablate.main([str(grid_path), "--no-estimate"]) == 2
    assert "the record is damaged" in capsys.readouterr().err
    assert json.loads(restored.read_text())["meta"]["note"] == "scored again"


@pytest.mark.slow  # about 14 s on 2 quiet cores; CI runs it (-m slow)
def test_archive_alone_keeps_what_another_process_finished(tmp_path, corpus, capsys):
    grid_path = kept_grid(tmp_path, corpus)
    text = grid_path.read_text()
    grid_path.write_text(text.replace(f"archive: {tmp_path / 'archive'}\n", ""))
    assert ablate.main([str(grid_path), "--archive"]) == 2
    assert "--archive needs the grid's 'archive' key" in capsys.readouterr().err
    # Trained, one of them evaluated (as a grid trained with --skip-eval, then one evaluation).
    assert ablate.main([str(grid_path), "--skip-eval", "--no-estimate"]) == 0
    grid_path.write_text(text)
    runs = load_grid(grid_path).plan()
    local.evaluate_one(runs[0], local.Slot())
    capsys.readouterr()
    assert ablate.main([str(grid_path), "--archive"]) == 0
    out = capsys.readouterr().out
    assert f"archived 1 runs in {tmp_path / 'archive'}: {runs[0].name}" in out
    assert f"not archived: {runs[1].name}: extrapolation, diagnostics not evaluated" in out
    assert sorted(p.name for p in (tmp_path / "archive").iterdir()) == [runs[0].name]
    assert not is_record(RunDir.of(runs[0].cfg))  # the run itself keeps its weights

    # On a fresh clone, --report writes the report of what the archive holds, training nothing.
    shutil.rmtree(tmp_path / "runs")
    assert ablate.main([str(grid_path), "--report"]) == 0  # an unfinished run is the grid's state, not a failure
    out = capsys.readouterr().out
    assert "1/2 runs finished" in out and f"not finished, so not in the reports (1): {runs[1].name}" in out
    assert "failed" not in out
    assert not RunDir.of(runs[1].cfg).path.exists()
    report = (tmp_path / "report" / "report.md").read_text()
    assert runs[0].name.split("_")[0] in report and "Missing runs" in report


def test_an_archive_inside_the_report_is_refused(tmp_path, corpus):
    grid_path = kept_grid(tmp_path, corpus, archive="report/runs")
    with pytest.raises(ConfigError, match="inside the report directory"):
        load_grid(grid_path)


@pytest.mark.slow  # a grid, its clone and fine-tunes: about 34 s on 2 quiet cores; CI runs it (-m slow)
def test_a_grid_that_keeps_weights_can_be_fine_tuned_from_on_a_fresh_clone(tmp_path, corpus, capsys):
    grid_path = kept_grid(tmp_path, corpus, extra="archive_weights: true")
    grid = load_grid(grid_path)
    runs = grid.plan()
    assert ablate.main([str(grid_path), "--no-estimate"]) == 0
    trained = {run.name: load_run(RunDir.of(run.cfg).path).model.state_dict() for run in runs}
    for run in runs:  # the final weights, as trained; still no optimizer state
        record = tmp_path / "archive" / run.name
        assert (record / "checkpoints" / "step_000008" / "model.safetensors").is_file()
        assert not list(record.rglob("*.pt"))
        assert json.loads((record / "record.json").read_text())["weights"] is True

    # A fresh clone: the records come back with their weights, which load as they were trained.
    shutil.rmtree(tmp_path / "runs")
    assert ablate.main([str(grid_path), "--no-estimate"]) == 0
    capsys.readouterr()
    parent = RunDir.of(runs[0].cfg)
    assert is_record(parent)
    loaded = load_run(parent.path).model.state_dict()
    assert all(torch.equal(loaded[k], trained[runs[0].name][k]) for k in loaded)

    # A child fine-tunes from it (init.run); the parent itself is not trained further.
    base = str(grid.base)
    assert train.main([base, *runs[0].overrides, f"out_dir={tmp_path / 'children'}", "name=child",
                       f"init.run={parent.path}", "train.max_steps=2", "train.eval_interval=2"]) == 0
    assert RunDir(tmp_path / "children" / "child").latest_checkpoint() is not None
    capsys.readouterr()
    assert train.main([base, *runs[0].overrides, "train.max_steps=12", "train.resume=auto"]) == 2
    err = capsys.readouterr().err
    assert "is a run record" in err and "not trained further" in err and "Traceback" not in err

    # Evaluated anew with another setting (a record without weights cannot be), and archived
    # again with the evaluations the grid now plans.
    other_eval = kept_grid(tmp_path, corpus, extra="archive_weights: true")
    other_eval.write_text(other_eval.read_text().replace("lengths: [32, 64], protocols", "lengths: [32, 48], protocols"))
    assert ablate.main([str(other_eval), "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert "failed" not in out, out
    for run in load_grid(other_eval).plan():
        kept = {p.name for p in (tmp_path / "archive" / run.name / "eval").glob("*.json.gz")}
        assert kept == {f"{p.name}.gz" for p in archive.planned_caches(run)}
        assert not kept & {f"{p.name}.gz" for p in archive.planned_caches(runs[0])
                           if p.name.startswith("extrapolation")}


@pytest.mark.parametrize("extra,archive,message", [
    ("archive_weights: yes-please", "archive", "'archive_weights' must be true or false"),
    ("archive_weights: true", None, "names none; add archive: DIR"),
])
def test_bad_archive_weights_are_refused(tmp_path, corpus, extra, archive, message):
    grid_path = kept_grid(tmp_path, corpus, extra=extra)
    if archive is None:
        grid_path.write_text(grid_path.read_text().replace(f"archive: {tmp_path / 'archive'}\n", ""))
    with pytest.raises(ConfigError, match=message):
        load_grid(grid_path)
