"""The shape probe: what it times, how it interpolates, what keys a shape."""

from __future__ import annotations

import math

import pytest
import torch

from configs.schema import RunConfig, TrainConfig
from model.config import ModelConfig
from training import probe
from training.runtime import setup_runtime


def test_rates_between_measured_lengths_are_log_log_interpolated():
    times = probe.ShapeTimes("k", eval_tok_s={"128": 8000.0, "2048": 2000.0})
    assert probe.rate_at(times, 128) == 8000.0 and probe.rate_at(times, 2048) == 2000.0
    # 512 is halfway in log length: the geometric mean of the rates.
    assert probe.rate_at(times, 512) == pytest.approx(math.sqrt(8000.0 * 2000.0))
    assert probe.rate_at(times, 64) == 8000.0 and probe.rate_at(times, 4096) == 2000.0  # the nearest beyond
    assert probe.rate_at(probe.ShapeTimes("k"), 128) is None
    assert probe._spread([64, 128, 192, 256, 512, 1024, 2048]) == [64, 256, 1024, 2048]


def test_a_shape_is_what_sets_a_steps_cost():
    cfg = RunConfig(model=ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4))
    rt = setup_runtime(cfg.train)
    key = probe.shape_key(cfg, rt)
    assert key == probe.shape_key(RunConfig(model=cfg.model, name="other", train=TrainConfig(seed=3)), rt)
    assert key != probe.shape_key(RunConfig(model=cfg.model, train=TrainConfig(seq_len=64)), rt)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert key != probe.shape_key(cfg, rt)
    finally:
        torch.set_num_threads(threads)


def test_timing_a_shape_touches_no_random_state_and_is_recorded():
    cfg = RunConfig(model=ModelConfig(vocab_size=97, d_model=32, n_layers=1, n_heads=4),
                    train=TrainConfig(seq_len=16, batch_size=2))
    rt = setup_runtime(cfg.train)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    times = probe.measure_training(cfg, rt, compiled=False)
    times = probe.measure_evaluation(cfg, rt, [16, 32, 256])
    assert torch.equal(torch.get_rng_state(), before)
    assert times.eager_step_s > 0 and set(times.eval_tok_s) == {"16", "256"}
    assert probe.load(probe.shape_key(cfg, rt)).eval_tok_s == times.eval_tok_s
