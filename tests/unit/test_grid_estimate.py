"""The grid's time estimate (scripts/grid_estimate.py): what it counts, and how it says when
its timings cannot be trusted as they stand."""

from __future__ import annotations

import logging

import pytest

from ropelab.configs.grid import load_grid
from ropelab.grid.estimate_table import print_estimates, print_wall_times

from helpers.runs import synthetic_grid, tiny_grid, write_grid


def test_a_shape_timed_on_a_busy_machine_says_so(tmp_path, corpus, monkeypatch, caplog):
    """Other work on the CPUs slows the timed steps: the record keeps that, and the estimate
    says which shape and how to time it again; on a quiet machine the shape is timed again by
    itself. Quiet is when the others' load is under half the CPUs (this process's own thread
    not counted)."""
    from ropelab.grid.estimate import estimate_grid
    from ropelab.training import step_timing
    monkeypatch.setenv("ROPELAB_PROBE_CACHE", str(tmp_path / "probes"))  # timed here, not found timed
    monkeypatch.setattr(step_timing.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(step_timing.os, "getloadavg", lambda: (1.9, 0.0, 0.0))
    assert step_timing.machine_busy() == ""
    monkeypatch.setattr(step_timing.os, "getloadavg", lambda: (3.2, 0.0, 0.0))
    assert step_timing.machine_busy() == "load average 3.2 on 2 CPUs"
    grid = tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope"]})
    caplog.set_level(logging.INFO, logger="ropelab")
    estimates = estimate_grid(load_grid(grid), load_grid(grid).plan(), None)
    assert all(e.note.endswith("; timed while busy") for e in estimates.values())
    assert any("timed while other work shared the CPUs (load average 3.2 on 2 CPUs)" in line and
               str(step_timing.cache_dir()) in line for line in caplog.messages)
    # While the machine stays busy the record stands (timing it again would be no better) ...
    key = next(p.stem for p in step_timing.cache_dir().glob("*.json") if p.stem != "matmul-peaks")
    assert step_timing.load(key).busy and step_timing.load(key).eager_step_s is not None
    caplog.clear()
    estimate_grid(load_grid(grid), load_grid(grid).plan(), None)
    assert not any("timing the shape" in line for line in caplog.messages)
    # ... and a quiet machine times the shape again, once, and keeps the quiet record.
    monkeypatch.setattr(step_timing.os, "getloadavg", lambda: (0.2, 0.0, 0.0))
    assert step_timing.load(key).eager_step_s is None  # read as no record
    caplog.clear()
    estimates = estimate_grid(load_grid(grid), load_grid(grid).plan(), None)
    assert any("timing the shape" in line for line in caplog.messages)
    assert not any("timed while busy" in e.note for e in estimates.values())
    assert step_timing.load(key).busy == "" and step_timing.load(key).eager_step_s is not None


def test_the_evaluation_estimate_counts_the_tokens_each_protocol_feeds():
    """Scored tokens / rate per length; sliding windows of stride S feed n/S tokens per scored one,
    the same-token protocol n/T; a RoPE scaling is one more model past L only."""
    from ropelab.configs.schema import EvalConfig, RunConfig, TrainConfig
    from ropelab.grid.estimate import eval_seconds
    from ropelab.training.step_timing import ShapeTimes
    rates = ShapeTimes("k", eval_tok_s={"16": 100.0, "32": 50.0, "64": 25.0})
    ev = EvalConfig(lengths=[16, 32, 64], protocols=["nonoverlap", "sliding", "same-tokens"], max_tokens=200,
                    scalings=["none", "yarn"])
    cfg = RunConfig(train=TrainConfig(seq_len=16), eval=ev)
    # nonoverlap 200/r; sliding (stride n/2) 400/r; same-tokens (T = 16) 200·n/16/r; yarn doubles 32 and 64.
    by_hand = sum(m * (200 + 400 + 200 * n / 16) / rates.eval_tok_s[str(n)] for n, m in ((16, 1), (32, 2), (64, 2)))
    assert eval_seconds(cfg, rates, split_tokens=10_000) == pytest.approx(by_hand)


def test_the_estimate_counts_every_task_depth_scaling_checkpoint_and_competence_check():
    """Task scoring: samples x length tokens per task, scaling and depth (tasks that place a
    needle), for every checkpoint of eval.steps; a competence check reads as many instances at
    L per task as a validation, and its budget is an upper bound."""
    from ropelab.configs.schema import DataConfig, EvalConfig, RunConfig, TokenizerConfig, TrainConfig
    from ropelab.configs.tasks import SyntheticConfig, TaskEvalConfig
    from ropelab.grid.estimate import eval_seconds, train_seconds
    from ropelab.training.step_timing import ShapeTimes
    rates = ShapeTimes("k", eager_step_s=0.5, eval_tok_s={"16": 100.0, "32": 50.0})
    data = DataConfig(source="synthetic", tokenizer=TokenizerConfig(kind="char"), synthetic=SyntheticConfig(tasks=["copy"]))
    ev = EvalConfig(lengths=[16, 32], scalings=["none", "yarn"], steps=[0, 10, 20],
                    tasks=TaskEvalConfig(tasks=["passkey", "copy"], samples=4, depths=[0.0, 0.5, 1.0]))
    cfg = RunConfig(data=data, train=TrainConfig(seq_len=16, batch_size=2, eval_batches=3, eval_interval=10,
                                                 stop_at_accuracy=0.9), eval=ev)
    per_checkpoint = (3 + 1) * 2 * 4 * (16 / 100.0 + 32 / 50.0)  # (passkey's depths + copy) × scalings × samples
    assert eval_seconds(cfg, rates, split_tokens=0) == pytest.approx(3 * per_checkpoint)
    seconds, note = train_seconds(cfg, rates, 20)
    validation = 3 * 2 * 16 / 100.0  # eval_batches × batch × L at the rate at L, three times (steps 0, 10, 20)
    assert seconds == pytest.approx(20 * 0.5 + 3 * (1 + 1) * validation) and "at most" in note


def test_jobs_at_once_on_the_cpu_stretch_each_runs_estimate_by_their_slowdown(tmp_path, corpus, monkeypatch, capsys):
    """With --jobs 2 each shape is also timed as two jobs at once (here: a shared step twice the
    step alone), and every run's training and evaluation estimates are twice the single job's."""
    from ropelab.scripts import ablate
    from ropelab.grid import estimate as grid_estimate
    from ropelab.training import step_timing
    monkeypatch.setenv("ROPELAB_PROBE_CACHE", str(tmp_path / "probes"))
    asked = []

    def shared(cfg, rt, jobs, threads):
        asked.append((jobs, threads))
        times = step_timing.load(step_timing.shape_key(cfg, rt))
        times.shared_step_s[str(jobs)] = 2 * times.eager_step_s
        times.save()
        return times
    monkeypatch.setattr(grid_estimate, "measure_shared", shared)
    monkeypatch.setattr(grid_estimate.torch, "set_num_threads", lambda n: None)  # this process's threads kept
    grid = tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope"]})
    alone = grid_estimate.estimate_grid(load_grid(grid), load_grid(grid).plan(), 1)
    together = grid_estimate.estimate_grid(load_grid(grid), load_grid(grid).plan(), 1, jobs=2)
    assert asked == [(2, 1)]  # the one shape, once
    for name, e in together.items():
        assert e.train_s == pytest.approx(2 * alone[name].train_s) and e.eval_s == pytest.approx(2 * alone[name].eval_s)
        assert "×2.0 with 2 jobs at once" in e.note and "jobs at once" not in alone[name].note
    # A probe that failed leaves the estimate as one job's, and says it may run long.
    monkeypatch.setattr(grid_estimate, "measure_shared", lambda cfg, rt, jobs, threads: step_timing.load(step_timing.shape_key(cfg, rt)))
    failed = grid_estimate.estimate_grid(load_grid(grid), load_grid(grid).plan(), 1, jobs=3)
    assert all(e.train_s == pytest.approx(alone[n].train_s) and "(that probe failed): may run long" in e.note
               for n, e in failed.items())
    # The grid's dry run estimates for as many jobs as share the CPU (the shape's record now cached).
    assert ablate.main([str(grid), "--dry-run", "--jobs", "2"]) == 0
    assert "×2.0 with 2 jobs at once" in capsys.readouterr().out


def test_wall_times_name_their_units_beside_the_estimate(capsys):
    print_wall_times({"perplexity": [{"name": "a", "train_seconds": 7200, "eval_seconds": 90}],
                      "tasks": [{"name": "a", "train_seconds": 7200, "eval_seconds": 30}]},
                     {"a": {"train_s": 6000, "eval_s": 180}})
    head, row, total = capsys.readouterr().out.strip().splitlines()
    assert "train (min)" in head and "perplexity eval (min)" in head and "tasks eval (min)" in head
    assert "estimated train" in head and "estimated eval" in head
    assert row.split() == ["a", "120.0", "1.5", "0.5", "100.0", "3.0"]
    assert total.split()[-10:] == ["2.00", "0.03", "0.01", "1.67", "0.05", "together", "2.03", "hours,",
                                   "estimated", "1.72"]


def test_pending_seeds_are_expected_to_stop_where_their_rows_seeds_did(tmp_path, capsys, monkeypatch):
    """A competence-stopped grid: the estimate stays the whole budget (an upper bound), and a seed
    in a row whose seeds have ended (read from their archived records: stopped at competence, or
    at the whole budget) is also expected at their mean step (resumed: at the mean of those that
    went past its step); the total says so."""
    import json

    from ropelab.grid import estimate as grid_estimate
    from ropelab.training.run_dir import RunDir
    synthetic_grid(tmp_path)
    grid_file = write_grid(tmp_path, name="stop-grid", base=tmp_path / "syn.yaml", archive=tmp_path / "kept",
                           overrides=["train.max_steps=100", "train.eval_interval=10", "train.stop_at_accuracy=0.9"],
                           axes={"model.pos.kind": ["rope", "alibi"], "train.seed": [0, 1, 2]})
    grid = load_grid(grid_file)
    runs = grid.plan()

    def keep(name: str, step: int, reached: bool) -> None:
        meta = tmp_path / "kept" / name / "checkpoints" / f"step_{step:06d}" / "meta.json"
        meta.parent.mkdir(parents=True)
        meta.write_text(json.dumps({"step": step, "competence": {"reached": reached}}))
    keep("kind-rope_seed-0", 40, True)
    keep("kind-rope_seed-1", 100, False)  # ran out of its budget: ended too
    keep("kind-alibi_seed-0", 50, False)  # neither reached nor at its budget: not ended
    ended = grid_estimate.rows_ended(grid, runs)
    assert ended == {"kind-rope": [40, 100]}
    pending = [r for r in runs if r.name in ("kind-rope_seed-2", "kind-alibi_seed-1")]
    monkeypatch.setattr(grid_estimate, "train_seconds", lambda cfg, times, steps: (steps * 6.0, "eager"))
    estimates = grid_estimate.estimate_grid(grid, pending, None, ended=ended)
    rope, alibi = estimates["kind-rope_seed-2"], estimates["kind-alibi_seed-1"]
    assert alibi.train_s == 600 and alibi.expected_train_s is None and "expected" not in alibi.note
    assert rope.train_s == 600 and rope.expected_train_s == 420  # (40 + 100) / 2 = 70 steps
    assert (rope.competence_row, rope.done, rope.steps) == ("kind-rope", 0, 100)  # a deadline renews it from these
    assert "expected 7.0 min as its row's 2 ended runs" in rope.note
    print_estimates(estimates, 1)
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("expected where rows have ended runs") and "the 1 run in such rows stop" in line
    # Resumed at step 60 in a row whose seeds ended at 40, 80 and 100: those past 60 say 30 more
    # steps (its budget says 40); in a row whose one seed ended at 40, nothing is expected.
    checkpoint = RunDir.of(pending[0].cfg).checkpoints / "step_000060"  # kind-rope_seed-2 trained 60 steps
    checkpoint.mkdir(parents=True)
    (checkpoint / "meta.json").write_text(json.dumps({"step": 60}))
    resumed = grid_estimate.estimate_grid(grid, pending, None,
                                          ended={"kind-rope": [40, 80, 100]})["kind-rope_seed-2"]
    assert resumed.train_s == 240 and resumed.expected_train_s == 180
    assert (resumed.done, resumed.steps) == (60, 40)
    assert "expected 3.0 min as its row's 2 ended runs that went past its step 60" in resumed.note
    alone = grid_estimate.estimate_grid(grid, pending, None,
                                        ended={"kind-rope": [40]})["kind-rope_seed-2"]
    assert alone.expected_train_s is None and "expected" not in alone.note


def test_data_that_cannot_be_prepared_gives_its_runs_no_estimate(tmp_path, corpus, monkeypatch, caplog):
    """The data is prepared once per data config; where that fails, each run on it gets a failed
    estimate naming the error (the run itself fails with it), and nothing is timed for them."""
    import ropelab.grid.estimate as ge
    from ropelab.common.errors import UserError
    calls = []

    def missing(cfg, rt):
        calls.append(cfg.model.pos.kind)
        raise UserError("data.local.train: no such file")

    monkeypatch.setattr(ge, "prepare", missing)
    monkeypatch.setattr(ge, "load", lambda *a, **k: pytest.fail("timed a run whose data failed"))  # a shape's timings
    grid = load_grid(tiny_grid(tmp_path, corpus, {"model.pos.kind": ["rope", "alibi"]}))
    caplog.set_level(logging.INFO, logger="ropelab")
    estimates = ge.estimate_grid(grid, grid.plan(), None)
    assert calls == ["rope"]  # one data config: prepared (and failed) once
    assert set(estimates) == {"kind-rope", "kind-alibi"}
    assert all(e.failed and e.note == "no estimate: data.local.train: no such file" for e in estimates.values())
    assert caplog.messages == ["  preparing the data of kind-rope for the estimate (cached for training)",
                               "  no estimate for 2 runs (kind-rope, kind-alibi): data.local.train: no such file"]


def test_a_dry_run_prepares_no_data_and_scales_the_shapes_it_did_not_time(tmp_path, corpus, monkeypatch, caplog,
                                                                        capsys):
    """A dry run answers quickly: data not prepared yet is sized from its config and files (nothing
    tokenized or written), and once its timing budget is spent a shape is scaled from the timed
    one by FLOPs per token, each estimate saying so; a grid with nothing to estimate prints why."""
    import ropelab.grid.estimate as ge
    from ropelab.model.transformer import Transformer
    monkeypatch.setenv("ROPELAB_PROBE_CACHE", str(tmp_path / "probes"))
    monkeypatch.setattr(ge, "prepare", lambda cfg, rt: pytest.fail("a dry run prepared the data"))
    monkeypatch.setattr(ge, "DRY_RUN_TIMING_S", 0.0)  # the first shape is timed, every later one scaled
    grid = load_grid(tiny_grid(tmp_path, corpus, {"model.d_model": [32, 64]}))
    caplog.set_level(logging.INFO, logger="ropelab")
    estimates = ge.estimate_grid(grid, grid.plan(), None, dry_run=True)
    timed, scaled = estimates.values()  # d_model 32, then 64
    assert not timed.failed and "scaled by FLOPs" not in timed.note
    assert "not timed (the dry run's timing budget was spent): scaled by FLOPs" in scaled.note
    vocab = ge.train_tokenizer(grid.plan()[0].cfg.data.tokenizer, []).vocab_size  # bytes: from the config alone
    cfgs = {run.cfg.model.d_model: run.cfg.with_vocab_size(vocab) for run in grid.plan()}
    flops = {d: Transformer(c.model).flops_per_token(c.train.seq_len, training=True) for d, c in cfgs.items()}
    assert scaled.train_s / timed.train_s == pytest.approx(flops[64] / flops[32], rel=1e-6)
    valid = (corpus / "valid.txt").stat().st_size
    assert sum("is not prepared here, and a dry run is not tokenizing it" in m and f"≈ {valid:,} tokens" in m
               for m in caplog.messages) == 1  # said once for the grid's one corpus
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    capsys.readouterr()
    print_estimates({"a": ge.Estimate(0.0, 0.0, "no estimate: x", failed=True)}, 1)
    assert "no estimate: none of the 1 runs could be estimated" in capsys.readouterr().out


def test_a_hub_grid_names_its_local_twin(tmp_path):
    from ropelab.grid.estimate import twin_of
    hub, local = tmp_path / "study.yaml", tmp_path / "study-local.yaml"
    for path in (hub, local):
        path.write_text("")
    assert twin_of(type("G", (), {"source": str(hub)})()) == local
    assert twin_of(type("G", (), {"source": str(local)})()) is None
    local.unlink()
    assert twin_of(type("G", (), {"source": str(hub)})()) is None
