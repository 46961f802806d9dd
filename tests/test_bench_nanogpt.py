"""scripts/bench_nanogpt.py: what it reads from nanoGPT's log and how it refuses a wrong checkout."""

from __future__ import annotations

import pytest

from common.errors import UserError
from scripts import bench_nanogpt

LOG = """tokens per iteration will be: 768
step 0: train loss 4.2874, val loss 4.2823
iter 0: loss 4.2655, time 1500.00ms, mfu -100.00%
iter 1: loss 4.1000, time 50.00ms, mfu -100.00%
iter 2: loss 3.9000, time 70.00ms, mfu 0.10%
step 3: train loss 3.5000, val loss 3.6000
iter 3: loss 3.4000, time 380.00ms, mfu 0.10%
"""


def test_loop_time_counts_every_iteration_and_its_evaluation():
    found = bench_nanogpt.parse_nanogpt(LOG)
    assert found["seconds"] == pytest.approx(1.5 + 0.05 + 0.07 + 0.38)
    assert found["tokens"] == 4 * 12 * 64 and found["val_loss"] == 3.6


def test_a_log_without_iterations_is_an_error_not_a_zero():
    with pytest.raises(UserError, match="no 'iter N"):
        bench_nanogpt.parse_nanogpt("Traceback (most recent call last):\nModuleNotFoundError: tiktoken\n")


def test_ratios_are_taken_within_each_round():
    rounds = [{"nanogpt": {"tokens_per_sec": 100.0}, "eager": {"tokens_per_sec": 90.0}},
              {"nanogpt": {"tokens_per_sec": 50.0}, "eager": {"tokens_per_sec": 55.0}}]
    summary = bench_nanogpt.summarize(rounds)
    assert summary["eager / nanogpt"]["ratios"] == [0.9, 1.1] and summary["eager / nanogpt"]["interval"] is None
    assert "compiled / nanogpt" not in summary


def test_a_directory_that_is_not_nanogpt_is_refused(tmp_path, capsys):
    assert bench_nanogpt.main(["--nanogpt", str(tmp_path), "--rounds", "1"]) == 2
    assert "needs nanoGPT's train.py" in capsys.readouterr().err
