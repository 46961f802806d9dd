"""The shape probe: what it times, how it interpolates, what keys a shape."""

from __future__ import annotations

import math

import pytest
import torch

from ropelab.configs.schema import RunConfig, TrainConfig
from ropelab.model.config import ModelConfig
from ropelab.training import step_timing
from ropelab.training.runtime import setup_runtime


def test_rates_between_measured_lengths_are_log_log_interpolated():
    times = step_timing.ShapeTimes("k", eval_tok_s={"128": 8000.0, "2048": 2000.0})
    assert step_timing.rate_at(times, 128) == 8000.0 and step_timing.rate_at(times, 2048) == 2000.0
    # 512 is halfway in log length: the geometric mean of the rates.
    assert step_timing.rate_at(times, 512) == pytest.approx(math.sqrt(8000.0 * 2000.0))
    assert step_timing.rate_at(times, 64) == 8000.0 and step_timing.rate_at(times, 4096) == 2000.0  # the nearest beyond
    assert step_timing.rate_at(step_timing.ShapeTimes("k"), 128) is None


def test_the_evaluation_is_timed_at_a_spread_of_its_lengths(tmp_path, monkeypatch):
    """The shortest, the longest, and every ~4× between: rate_at interpolates the rest."""
    monkeypatch.setenv("ROPELAB_PROBE_CACHE", str(tmp_path))  # nothing timed before
    cfg = RunConfig(model=ModelConfig(vocab_size=97, d_model=32, n_layers=1, n_heads=4),
                    train=TrainConfig(seq_len=4, batch_size=2))
    times = step_timing.measure_evaluation(cfg, setup_runtime(cfg.train), [4, 8, 12, 16, 32, 64, 128])
    assert sorted(map(int, times.eval_tok_s)) == [4, 16, 64, 128]


def test_a_shape_is_what_sets_a_steps_cost():
    cfg = RunConfig(model=ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4))
    rt = setup_runtime(cfg.train)
    key = step_timing.shape_key(cfg, rt)
    assert key == step_timing.shape_key(RunConfig(model=cfg.model, name="other", train=TrainConfig(seed=3)), rt)
    assert key != step_timing.shape_key(RunConfig(model=cfg.model, train=TrainConfig(seq_len=64)), rt)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert key != step_timing.shape_key(cfg, rt)
    finally:
        torch.set_num_threads(threads)


def test_timing_a_shape_touches_no_random_state_and_is_recorded():
    cfg = RunConfig(model=ModelConfig(vocab_size=97, d_model=32, n_layers=1, n_heads=4),
                    train=TrainConfig(seq_len=16, batch_size=2))
    rt = setup_runtime(cfg.train)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    times = step_timing.measure_training(cfg, rt, compiled=False)
    times = step_timing.measure_evaluation(cfg, rt, [16, 32, 256])
    assert torch.equal(torch.get_rng_state(), before)
    assert times.eager_step_s > 0 and set(times.eval_tok_s) == {"16", "256"}
    assert step_timing.load(step_timing.shape_key(cfg, rt)).eval_tok_s == times.eval_tok_s


def test_jobs_timed_together_record_one_jobs_step_and_the_slowdown_it_means():
    """Two spawned processes, one thread each, time the eager step at once: the record keeps
    one job's step under the number of jobs, and the slowdown is that over the step alone."""
    cfg = RunConfig(model=ModelConfig(vocab_size=97, d_model=32, n_layers=1, n_heads=4),
                    train=TrainConfig(seq_len=16, batch_size=2))
    rt = setup_runtime(cfg.train)
    times = step_timing.measure_shared(cfg, rt, jobs=2, threads=1)
    assert times.eager_step_s > 0 and times.shared_step_s["2"] > 0
    assert step_timing.load(step_timing.shape_key(cfg, rt)).shared_step_s == times.shared_step_s
    assert step_timing.shared_slowdown(times, 2) == max(1.0, times.shared_step_s["2"] / times.eager_step_s)


def test_the_slowdown_is_one_where_nothing_says_otherwise():
    times = step_timing.ShapeTimes("k", eager_step_s=0.04, shared_step_s={"2": 0.09, "4": 0.03})
    assert step_timing.shared_slowdown(times, 2) == pytest.approx(2.25)
    assert step_timing.shared_slowdown(times, 1) == 1.0  # one job: alone
    assert step_timing.shared_slowdown(times, 3) == 1.0  # not measured for three
    assert step_timing.shared_slowdown(times, 4) == 1.0  # faster in company: noise, not a gain
    assert step_timing.shared_slowdown(step_timing.ShapeTimes("k", shared_step_s={"2": 0.09}), 2) == 1.0


def test_a_shared_probe_whose_jobs_fail_records_nothing_and_returns_at_once():
    """The jobs fail (no token to draw from a vocabulary of none) after the step alone was
    recorded: the probe hears it from them, not after its timeout, and records no shared step."""
    cfg = RunConfig(model=ModelConfig(vocab_size=97, d_model=32, n_layers=1, n_heads=4),
                    train=TrainConfig(seq_len=16, batch_size=2))
    object.__setattr__(cfg.model, "vocab_size", 0)  # past the config's own check, as a bug would be
    rt = setup_runtime(cfg.train)
    step_timing.ShapeTimes(step_timing.shape_key(cfg, rt), eager_step_s=0.01).save()
    times = step_timing.measure_shared(cfg, rt, jobs=2, threads=1)
    assert times.eager_step_s == 0.01 and times.shared_step_s == {}
    assert step_timing.load(step_timing.shape_key(cfg, rt)).shared_step_s == {}
