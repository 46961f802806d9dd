"""torch.compile in training: the same losses as eager, and train.compile=auto's decision."""

from __future__ import annotations

import json

import pytest

from ropelab import train
from helpers.runs import write_run_config
from ropelab.configs import load_config
from ropelab.training import step_timing
from ropelab.training import trainer as trainer_module
from ropelab.training.runtime import setup_runtime


def losses(run_dir) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.fixture()
def cfg(tmp_path, corpus, monkeypatch):
    monkeypatch.setenv("ROPELAB_PROBE_CACHE", str(tmp_path / "probes"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return write_run_config(tmp_path, corpus)


@pytest.mark.slow  # a cold inductor compile: about 35 s on 2 cores
def test_compiled_training_gives_eager_losses(cfg, tmp_path):
    """The first steps' losses of a compiled run equal the eager run's within float tolerance."""
    args = [str(cfg), "train.max_steps=4", "train.eval_interval=4", "model.n_layers=1"]
    assert train.main([*args, "name=eager"]) == 0
    assert train.main([*args, "name=compiled", "train.compile=true"]) == 0
    eager, compiled = losses(tmp_path / "runs" / "eager"), losses(tmp_path / "runs" / "compiled")
    assert len(eager) == 4 and compiled == pytest.approx(eager, rel=1e-4)


def _record(cfg_path, overrides, **times) -> None:
    cfg = load_config(cfg_path, overrides).with_vocab_size(257)
    rt = setup_runtime(cfg.train)
    record = step_timing.ShapeTimes(step_timing.shape_key(cfg, rt), **times)
    record.save()


def test_auto_follows_the_shapes_record_and_a_resume_keeps_the_choice(cfg, tmp_path, monkeypatch, capsys):
    overrides = ["train.max_steps=6", "train.ckpt_interval=3", "train.compile=auto"]
    # Compiled steps 10 ms faster over 6 steps save 0.06 s: less than a 5 s compile.
    _record(cfg, overrides, eager_step_s=0.05, compiled_step_s=0.04, compile_warm_s=5.0, compile_cold_s=30.0)
    compiled = []
    monkeypatch.setattr(trainer_module.torch, "compile", lambda m: compiled.append(m) or m)
    assert train.main([str(cfg), *overrides, "name=slow-compile"]) == 0
    assert not compiled and "train.compile=auto: eager: 6 steps" in capsys.readouterr().out
    # A cheap compile pays: 6 steps × 1 s saved against 0.5 s.
    _record(cfg, overrides, eager_step_s=2.0, compiled_step_s=1.0, compile_warm_s=0.5, compile_cold_s=30.0)
    calls = []
    original = step_timing.compile_decision
    monkeypatch.setattr(trainer_module, "compile_decision", lambda *a: calls.append(a) or original(*a))
    stop = {"at": 3}
    step = trainer_module.Trainer.train_step

    def stopping(self):
        out = step(self)
        if self.step == stop["at"]:
            self.stop_signal = 15
        return out
    monkeypatch.setattr(trainer_module.Trainer, "train_step", stopping)
    assert train.main([str(cfg), *overrides, "name=cheap-compile"]) == 128 + 15
    assert len(compiled) == 1 and len(calls) == 1
    # Resumed: the recorded choice is kept (no new decision), and the model compiled again.
    stop["at"] = -1
    assert train.main([str(cfg), *overrides, "name=cheap-compile", "--resume"]) == 0
    assert len(calls) == 1 and len(compiled) == 2


def test_auto_without_a_record_stays_eager_for_a_short_run(cfg, monkeypatch, capsys):
    asked = []
    original = step_timing.measure_training
    monkeypatch.setattr(step_timing, "measure_training", lambda c, rt, compiled: asked.append(compiled) or original(c, rt, compiled))
    assert train.main([str(cfg), "train.max_steps=3", "train.compile=auto", "name=short"]) == 0
    assert asked == [False]  # the eager step was timed; compiling was never tried
    assert "less than a first compile costs" in capsys.readouterr().out


@pytest.mark.slow  # two small inductor compiles: about 20 s on 2 cores
def test_timing_many_shapes_in_one_process_compiles_each(cfg, monkeypatch):
    """A grid's estimate times every shape in one process: each compile must really compile.
    Past dynamo's recompile limit a compile runs eager, and its times would be recorded as
    compiled ones (which train.compile=auto then reads); a limit of 1 shows it at once. Timing
    a shape compiles it twice (the cold and the warm compile): each first call of a compiled
    model must add graphs. Dynamo's limit and counters have no public name in torch."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    real_compile, graphs = torch.compile, []

    def counted(model):  # torch.compile, counting the graphs of the compiled model's first call
        compiled, calls = real_compile(model), []

        def call(*args, **kwargs):
            before = counters["stats"]["unique_graphs"]
            out = compiled(*args, **kwargs)
            if not calls:
                graphs.append(counters["stats"]["unique_graphs"] - before)
            calls.append(1)
            return out
        return call

    monkeypatch.setattr(torch, "compile", counted)
    run_cfg = load_config(cfg, ["model.n_layers=1", "train.batch_size=2"]).with_vocab_size(257)
    # config.patch, not monkeypatch: setting the option back by setattr leaves dynamo's config
    # unreadable for every later test in the process (FlexAttention's among them).
    with torch._dynamo.config.patch(recompile_limit=1):
        step_timing.measure_training(run_cfg, setup_runtime(run_cfg.train), compiled=True)
    assert len(graphs) == 2 and all(n >= 1 for n in graphs), graphs
