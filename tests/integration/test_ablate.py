"""scripts/ablate.py: plan, train, skip, resume, survive failures, report."""

from __future__ import annotations

import json
import os
import shlex
import signal
from pathlib import Path

import pytest

from ropelab import train
from ropelab.configs.grid import load_grid, row_of, run_stem
from helpers.runs import stop_after, synthetic_grid, tiny_grid, write_grid, write_run_config
from ropelab.common.errors import ConfigError, UserError
from ropelab.scripts import ablate
from ropelab.grid import local as grid_local
from ropelab.grid import runner
from ropelab.grid.run_state import status
from ropelab.training.checkpoint import read_meta
from ropelab.training.run_dir import RunDir
from helpers import ROOT


def latest_checkpoint(run_dir: Path) -> Path:
    return RunDir(run_dir).latest_checkpoint()


def test_plan_names_and_validation(tmp_path, corpus):
    grid = load_grid(tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope", "alibi"], "train.seed": [1, 2]}))
    runs = grid.plan()
    assert [r.name for r in runs] == ["kind-rope_seed-1", "kind-rope_seed-2", "kind-alibi_seed-1", "kind-alibi_seed-2"]
    assert runs[2].cfg.model.pos.kind == "alibi" and runs[3].cfg.train.seed == 2
    assert RunDir.of(runs[0].cfg).path == tmp_path / "runs" / "tiny-grid" / "kind-rope_seed-1"
    bad = tiny_grid(tmp_path, corpus, {"model.pos.knd": ["rope"]}, name="bad")
    with pytest.raises(ConfigError, match="kind"):
        load_grid(bad).plan()
    typo = tmp_path / "typo.yaml"
    typo.write_text(f"name: t\nbase: {write_run_config(tmp_path, corpus).name}\naxis: {{}}\n")
    with pytest.raises(ConfigError, match="did you mean 'axes'"):
        load_grid(typo)


CLASSIC_KINDS = {"rope", "sinusoidal", "learned", "alibi", "none", "t5", "kerple", "fire", "xpos", "cope"}
# Every grid file; a file whose name starts with "_" is a part other grids inherit.
SHIPPED_GRIDS = sorted(p for p in (ROOT / "configs" / "ablations").rglob("*.yaml") if not p.name.startswith("_"))


@pytest.mark.parametrize("path", SHIPPED_GRIDS, ids=lambda p: p.stem)
def test_shipped_grids_plan(path):
    runs = load_grid(path).plan()
    rows: dict[tuple, list[int]] = {}
    for r in runs:  # a row: everything but the seed (and the parent, whose seeds pool, for fine-tunes)
        rows.setdefault((r.cfg.model.pos.kind, row_of(run_stem(r.name, r.cfg.init.run))), []).append(r.cfg.train.seed)
    seeds = {kind: min(len(s) for key, s in rows.items() if key[0] == kind) for kind, *_ in rows}
    assert min(seeds.values()) >= 2
    if path.stem.startswith(("pe-extrapolation", "length-generalization", "retrieval-cpu")):  # encoding studies
        # Every encoding there was when these studies were designed; later ones (FoX, DAPE)
        # and layer plans join studies of their own (the core study's rows).
        assert set(seeds) >= CLASSIC_KINDS and min(seeds.values()) >= 3
    if path.stem.startswith(("length-generalization-tasks", "retrieval-cpu")):  # a model per task, to competence
        assert all(len(r.cfg.data.synthetic.tasks) == 1 and r.cfg.train.stop_at_accuracy for r in runs)
        assert all(seeds[k] >= 5 for k in ("rope", "alibi", "kerple", "none", "sinusoidal"))
    elif path.stem.startswith("length-generalization"):  # one run per encoding, seed and task set
        tasks = len({tuple(r.cfg.data.synthetic.tasks) for r in runs})
        assert len(runs) == len(CLASSIC_KINDS) * 3 * tasks


def test_dry_run_trains_nothing(tmp_path, corpus, capsys):
    grid = tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope", "alibi"]})
    assert ablate.main([str(grid), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "kind-rope" in out and "new" in out and "python train.py" in out
    assert not (tmp_path / "runs").exists()
    # The time estimate: each pending run, from its shape's timed steps (now cached).
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines() if line.startswith("kind-")}
    assert set(rows) == {"kind-rope", "kind-alibi"} and all(float(v) >= 0 for v in sum(rows.values(), []))
    assert "grid total (hours)" in out and "wall time with 1 job" in out
    from ropelab.grid.estimate import estimate_grid
    estimates = estimate_grid(load_grid(grid), load_grid(grid).plan(), None)
    assert all(e.train_s > 0 and e.eval_s > 0 for e in estimates.values())  # from the cached timings


def test_training_from_changed_code_is_warned_of_before_it_starts(tmp_path, corpus, capsys, monkeypatch):
    grid = tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope", "alibi"]})
    monkeypatch.setattr(runner, "git_commit", lambda: "c" * 40)
    assert ablate.main([str(grid), "--dry-run", "--no-estimate"]) == 0
    assert "warning" not in capsys.readouterr().err
    monkeypatch.setattr(runner, "git_commit", lambda: "c" * 40 + "-dirty")
    assert ablate.main([str(grid), "--dry-run", "--no-estimate"]) == 0
    err = capsys.readouterr().err
    assert f"the runs trained now record {'c' * 12}-dirty" in err and "commit first" in err
    assert ablate.main([str(grid), "--report"]) == 0  # trains nothing: nothing to warn of
    assert "warning: the code differs" not in capsys.readouterr().err


def test_the_dry_run_command_pastes_into_a_shell(tmp_path, corpus, capsys):
    """Overrides such as eval.lengths=[16, 32, 64] hold spaces and brackets: each is quoted, so
    the printed command is the planned one word for word when pasted."""
    grid = tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope", "alibi"]})
    assert ablate.main([str(grid), "--dry-run"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("train one by hand with: "))
    run = load_grid(grid).plan()[0]
    words = shlex.split(line.removeprefix("train one by hand with: "))
    assert words == ["python", "train.py", os.path.relpath(load_grid(grid).base.resolve()), *run.overrides]
    assert "eval.lengths=[16, 32, 64]" in run.overrides
    # with --rows, one of the picked runs, not the grid's first
    assert ablate.main([str(grid), "--dry-run", "--no-estimate", "--rows", "*alibi*"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("train one by hand with: "))
    assert "model.pos.kind=alibi" in shlex.split(line) and "model.pos.kind=rope" not in shlex.split(line)


@pytest.mark.slow  # four passes over a trained grid: about 49 s on 2 quiet cores; CI runs it (-m slow)
def test_grid_end_to_end_skips_resumes_and_survives_failures(tmp_path, corpus, capsys, monkeypatch):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    axes = {"model.pos.kind": ["rope", "learned"], "train.seed": [1, 2], "data.local.valid": [[corpus / "valid.txt"]]}
    grid_path = tiny_grid(tmp_path, corpus, axes)
    grid = load_grid(grid_path)
    runs = grid.plan()
    # One run was interrupted earlier: it must resume, not restart.
    partial = runs[1]
    stop_after(8, monkeypatch)
    assert train.main([str(grid.base), *partial.overrides]) == 128 + signal.SIGTERM
    monkeypatch.undo()
    assert status(partial) == ("partial", "step 8/12")

    assert ablate.main([str(grid_path)]) == 0
    out = capsys.readouterr().out
    assert "4/4 runs finished" in out and "grid total" in out and "train (min)" in out
    started = [line.split()[1] for line in out.splitlines() if line.startswith("→ ")]
    assert started == [partial.name, runs[0].name, *(r.name for r in runs[2:])]  # what it began, first
    assert "resuming" in RunDir.of(partial.cfg).log.read_text()
    report = (tmp_path / "report" / "report.md").read_text()
    assert "rope" in report and "n/a (trained table: 32 positions)" in report and "95% interval" in report
    steps = {r.name: read_meta(latest_checkpoint(RunDir.of(r.cfg).path))["step"] for r in runs}
    assert set(steps.values()) == {12}

    # Again: nothing is trained again and evaluations come from the cache.
    mtimes = {r.name: RunDir.of(r.cfg).latest_pointer.stat().st_mtime_ns for r in runs}
    assert ablate.main([str(grid_path)]) == 0
    out = capsys.readouterr().out
    assert out.count(" done ") == 4 and out.count("reusing") == 4
    assert mtimes == {r.name: RunDir.of(r.cfg).latest_pointer.stat().st_mtime_ns for r in runs}
    # ... and no evaluation process was started for them: their logs hold the first pass's only.
    assert [RunDir.of(r.cfg).log.read_text().count("-m ropelab.eval.lm.extrapolation ") for r in runs] == [1] * 4
    # New evaluation settings in the grid: finished runs are evaluated again, never retrained.
    grid_path.write_text(grid_path.read_text().replace("lengths: [16, 32, 64]", "lengths: [16, 48]"))
    assert ablate.main([str(grid_path)]) == 0
    out = capsys.readouterr().out
    assert out.count(" done ") == 4 and "| 48 |" in (tmp_path / "report" / "report.md").read_text()
    assert all("L=48" in RunDir.of(r.cfg).log.read_text() for r in runs if "rope" in r.name)  # each run's job
    assert mtimes == {r.name: RunDir.of(r.cfg).latest_pointer.stat().st_mtime_ns for r in runs}

    # A grid where one run cannot work: the others still finish, the summary says why.
    failing = tiny_grid(tmp_path, corpus, {**axes, "data.local.valid": [[corpus / "valid.txt"], [empty]]})
    assert ablate.main([str(failing)]) == 1
    out = capsys.readouterr().out
    assert "4/8 runs finished" in out  # the 4 earlier runs; the 4 with an empty valid split fail
    failed = [line for line in out.splitlines() if line.strip().startswith("failed:")]
    assert len(failed) == 4 and all("valid" in line for line in failed)
    assert "Missing runs" in (tmp_path / "report" / "report.md").read_text()


def test_variants_are_named_rows_crossed_with_the_axes(tmp_path, corpus):
    grid = write_grid(tmp_path, corpus, name="v", out_dir=None,
                      variants={"rope": ["model.pos.kind=rope"],
                                "sin-1": ["model.pos.kind=sinusoidal", "model.pos.token_scale=1"]},
                      axes={"train.seed": [0, 1]})
    runs = load_grid(grid).plan()
    assert [r.name for r in runs] == ["rope_seed-0", "rope_seed-1", "sin-1_seed-0", "sin-1_seed-1"]
    assert runs[2].cfg.model.pos.kind == "sinusoidal" and runs[2].cfg.model.pos.token_scale == 1.0
    write_grid(tmp_path, name="v", base=tmp_path / "tiny.yaml", out_dir=None, variants="{bad name: []}")
    with pytest.raises(ConfigError, match="'variants' must map names"):
        load_grid(grid)


def test_cpu_jobs_are_single_threaded_slots(monkeypatch):
    monkeypatch.setattr(grid_local, "usable_cpus", lambda: 2)
    args = ablate.parse_args(["grid.yaml", "--jobs", "2"])
    slots = grid_local.slots_for(args)
    assert len(slots) == 2 and all(s.threads == 1 for s in slots)
    env = slots[0].env()
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert grid_local.slots_for(ablate.parse_args(["grid.yaml"])) == [grid_local.Slot()]  # one job: torch's default
    gpu = grid_local.slots_for(ablate.parse_args(["grid.yaml", "--devices", "cuda:0", "cuda:3"]))
    assert [s.env()["CUDA_VISIBLE_DEVICES"] for s in gpu] == ["0", "3"]
    with pytest.raises(SystemExit) as e:  # argparse's usage error
        ablate.main(["grid.yaml", "--jobs", "0"])
    assert e.value.code == 2


def test_synthetic_grid_gets_task_accuracy_not_perplexity(tmp_path, capsys):
    grid = synthetic_grid(tmp_path)
    assert ablate.main([str(grid)]) == 0
    out = capsys.readouterr().out
    assert "2/2 runs finished" in out and "tasks report" in out and "perplexity report" not in out
    report = (tmp_path / "report" / "tasks" / "report.md").read_text()
    assert "## copy" in report and "n/a (trained table: 16 positions)" in report
    assert not (tmp_path / "report" / "report.md").exists()


def test_a_run_that_stopped_at_competence_is_done(tmp_path, capsys):
    """Stopped before its budget because it learned its task: the grid neither retrains it nor
    calls it unfinished."""
    synthetic_grid(tmp_path)  # copying one letter ("a>a"): 30% exact match within ~40 steps
    grid = write_grid(tmp_path, name="stop-grid", base=tmp_path / "syn.yaml",
                      overrides=["train.seq_len=4", "train.batch_size=16", "train.lr=1.0e-2", "train.max_steps=200",
                                 "train.eval_interval=4", "train.ckpt_interval=4", "train.eval_batches=2",
                                 "train.stop_at_accuracy=0.3", "train.seed=3"])
    run = load_grid(grid).plan()[0]
    assert ablate.main([str(grid), "--skip-eval", "--no-estimate"]) == 0
    meta = read_meta(latest_checkpoint(RunDir.of(run.cfg).path))
    assert meta["step"] < 200 and meta["competence"]["reached"]
    assert status(run) == ("done", f"step {meta['step']}, competence reached")
    assert "1/1 runs finished" in capsys.readouterr().out


def test_impossible_task_settings_stop_a_grid_before_training(tmp_path, capsys):
    grid = synthetic_grid(tmp_path, "'data.synthetic.tasks=[copy, recall]'")  # recall: 31 positions
    assert ablate.main([str(grid)]) == 2
    err = capsys.readouterr().err
    assert "run kind-rope: recall with 8 pairs and 8 queries needs at least 31 positions" in err
    assert "train.seq_len is 16" in err and not (tmp_path / "runs").exists()


def test_cpu_workers_split_the_cores(tmp_path, monkeypatch):
    """--devices cpu cpu: two runs at a time, each told to use half the cores and the CPU."""
    runs = load_grid(synthetic_grid(tmp_path)).plan()
    calls = []

    class FakeProcess:  # each job's command and threads, started and ended at once
        def __init__(self, cmd, env, **kwargs):
            calls.append((cmd, env.get("OMP_NUM_THREADS")))

        def wait(self, timeout=None):
            return 0
    monkeypatch.setattr(grid_local.subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(grid_local, "usable_cpus", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    grid = load_grid(synthetic_grid(tmp_path))
    slots = grid_local.slots_for(ablate.parse_args(["grid.yaml", "--devices", "cpu", "cpu"]))
    assert grid_local.run_all(grid, runs, slots, evaluate=False) == {}
    assert len(calls) == 2 and all(threads == "2" and "train.device=cpu" in cmd for cmd, threads in calls)
    calls.clear()
    grid_local.run_all(grid, runs[:1], [grid_local.Slot()], evaluate=True)
    train, score = calls  # a synthetic run is scored on tasks only
    assert train[1] is None and "train.device=cpu" not in train[0]
    assert score[0][1:3] == ["-m", "ropelab.eval.tasks.exact_match"] and "--cache-only" in score[0]


def test_a_run_budgeted_by_tokens_is_done_when_its_tokens_are(tmp_path, corpus):
    """A token budget reached by N data-parallel ranks takes N times fewer steps than one
    process would plan: the grid reads the tokens the checkpoint saw, not its step."""
    grid = load_grid(tiny_grid(tmp_path, corpus, {"train.seed": [0]}))
    run = grid.plan(["train.max_steps=null", "train.max_tokens=2048"])[0]  # 8 steps of 8 × 32
    assert train.main([str(grid.base), *run.overrides]) == 0
    assert status(run) == ("done", "step 8")
    meta_path = latest_checkpoint(RunDir.of(run.cfg).path) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "step": 4}))  # two ranks: 4 steps of 2 × 256 tokens
    assert status(run) == ("done", "step 4")
    meta_path.write_text(json.dumps({**meta, "step": 2, "tokens": 1024}))
    assert status(run) == ("partial", "1,024/2,048 tokens")


def test_more_seeds_adds_training_runs_to_chosen_rows_only(tmp_path, corpus):
    path = tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope", "alibi"], "train.seed": [0, 1]})
    path.write_text(path.read_text() + "more_seeds: {kind-alibi: [2, 3]}\n")
    runs = load_grid(path).plan()
    assert [r.name for r in runs][-2:] == ["kind-alibi_seed-2", "kind-alibi_seed-3"]
    assert [(r.cfg.model.pos.kind, r.cfg.train.seed) for r in runs[-2:]] == [("alibi", 2), ("alibi", 3)]
    assert sum(r.cfg.model.pos.kind == "rope" for r in runs) == 2
    assert RunDir.of(runs[-1].cfg).path == tmp_path / "runs" / "tiny-grid" / "kind-alibi_seed-3"
    for bad, message in (("{kind-alibx: [2]}", "does not have; its rows are kind-alibi, kind-rope"),
                         ("{kind-alibi: [1]}", "already has seeds \\[0, 1\\]"), ("{kind-alibi: [-1]}", "integers >= 0")):
        path.write_text(path.read_text().rsplit("more_seeds", 1)[0] + f"more_seeds: {bad}\n")
        with pytest.raises(ConfigError, match=message):
            load_grid(path).plan()


def test_exclude_leaves_runs_of_the_product_out(tmp_path, corpus):
    """exclude: patterns on run names or rows; more_seeds cannot name a row left out, and a
    pattern that leaves out nothing (a typo) or everything is refused."""
    path = tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope", "alibi", "none"], "train.seed": [0, 1]})
    text = path.read_text()
    path.write_text(text + "exclude: ['kind-[!r]*_seed-1', kind-none]\n")
    assert [r.name for r in load_grid(path).plan()] == ["kind-rope_seed-0", "kind-rope_seed-1", "kind-alibi_seed-0"]
    for bad, message in (("exclude: [kind-nope]", "exclude 'kind-nope' matches no run of the grid"),
                         ("exclude: ['*']", "leaves out every run"), ("exclude: kind-none", "list of run-name patterns"),
                         ("exclude: [kind-none]\nmore_seeds: {kind-none: [2]}", "does not have")):
        path.write_text(text + bad + "\n")
        with pytest.raises(ConfigError, match=message):
            load_grid(path).plan()


def test_rows_trains_only_the_rows_named_and_reports_every_finished_run(tmp_path, corpus, capsys):
    """--rows: a grid's chosen rows first; the others stay untouched, are listed as left out,
    not failed, and the same command without --rows trains them later."""
    path = tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope", "alibi", "none"], "train.seed": [0]})
    runs = {r.name: r for r in load_grid(path).plan()}
    assert ablate.main([str(path), "--rows", "kind-alib*", "kind-none", "--no-estimate"]) == 0
    out = capsys.readouterr().out
    assert "kind-rope_seed-0" in out and "(not in --rows)" in out
    assert status(runs["kind-alibi_seed-0"])[0] == "done" and status(runs["kind-none_seed-0"])[0] == "done"
    assert not RunDir.of(runs["kind-rope_seed-0"].cfg).path.exists()
    assert "2/3 runs finished" in out and "not in --rows and not finished, so not in the reports (1): kind-rope" in out
    assert "failed:" not in out
    report = (tmp_path / "report" / "report.md").read_text()
    assert "kind-alibi" in report and "kind-none" in report
    assert f"- {tmp_path / 'runs' / 'tiny-grid' / 'kind-rope_seed-0'}: not finished" in report
    # A pattern that names no row: refused before anything runs, with the grid's rows.
    assert ablate.main([str(path), "--rows", "kind-rop", "--no-estimate"]) == 2
    err = capsys.readouterr().err
    assert "--rows kind-rop: no row" in err and "kind-rope, kind-alibi, kind-none" in err
    assert not RunDir.of(runs["kind-rope_seed-0"].cfg).path.exists()


def test_unfinished_runs_are_listed_a_line_per_row():
    """A grid reported while half trained (--rows, an interim report) lists its rows with their
    seeds folded, on stdout and in the reports' Missing runs, not every run on its own."""
    from ropelab.configs.grid import fold_seeds
    from ropelab.eval.reporting.runs_section import missing_lines
    names = ["alibi_seed-3", "rope_seed-10", "alibi_seed-2", "rope_seed-2", "seed-0", "seed-1", "run", "x_seed-4"]
    assert fold_seeds(names) == ["alibi_seed-{2,3}", "rope_seed-{2,10}", "seed-{0,1}", "run", "x_seed-4"]
    assert fold_seeds([]) == [] and fold_seeds(["a_seed-1", "a_seed-1"]) == ["a_seed-1"]
    missing = [{"run": "/r/a_seed-0", "error": "not finished"}, {"run": "/r/b_seed-0", "error": "CUDA out of memory"},
               {"run": "/r/a_seed-1", "error": "not finished"}, {"run": "/r/b_seed-1", "error": "not finished"}]
    assert missing_lines(missing) == ["- /r/a_seed-{0,1}: not finished", "- /r/b_seed-1: not finished",
                                      "- /r/b_seed-0: CUDA out of memory"]


def test_rows_picks_one_parents_fine_tunes_by_the_whole_run_name():
    """A fine-tune's row drops its parent's seed, so a pattern on rows alone cannot pick one
    parent's fine-tunes; --rows also matches whole run names for that, and still refuses a
    pattern that matches nothing."""
    grid = load_grid(ROOT / "configs" / "ablations" / "context-extension-retrieval-cpu-local.yaml")
    runs = grid.plan()
    parent0 = runner.chosen_runs(grid, runs, ["*parents-cpu-local_seed-0_*"])
    assert parent0 and len(parent0) < len(runs)
    assert all("_seed-0_seed-" in name for name in parent0)
    assert {row_of(name) for name in parent0} == {row_of(r.name) for r in runs}  # every method, one parent
    yarn = runner.chosen_runs(grid, runs, ["yarn*"])  # rows still match as before
    assert yarn == {r.name for r in runs if r.name.startswith("yarn")} and yarn
    assert runner.chosen_runs(grid, runs, None) == {r.name for r in runs}
    with pytest.raises(UserError, match="no row of .* matches"):
        runner.chosen_runs(grid, runs, ["*_seed-7_*"])


def test_a_dry_run_that_could_estimate_nothing_is_refused_with_the_reason(tmp_path, corpus, capsys, monkeypatch):
    """Every run's data fails to load: no estimate, each run's reason said once, then one error
    line with the reason and exit 2 (bad input), instead of a 'grid total 0.00 h' that reads as
    a free grid."""
    import ropelab.grid.estimate as ge
    from ropelab.common.errors import UserError

    def unreadable(run, rt, dry_run, twin=None):
        return UserError("data.local.valid: no such file")

    monkeypatch.setattr(ge, "_data_size", unreadable)
    grid = tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope", "alibi"]})
    assert ablate.main([str(grid), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "no estimate: none of the 2 runs could be estimated" in out and "grid total" not in out
    assert err.strip().splitlines()[-1] == ("error: none of the 2 runs can start: data.local.valid: no such file (each "
                                            "run fails with this when it trains); fix the grid's config or data and "
                                            "run the dry run again")
