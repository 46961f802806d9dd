"""scripts/bench_nanogpt.py: what it reads from nanoGPT's log and how it refuses a wrong checkout."""

from __future__ import annotations

import pytest

from ropelab.common.errors import UserError
from ropelab.bench import nanogpt
from ropelab.scripts import bench_nanogpt

LOG = """tokens per iteration will be: 768
step 0: train loss 4.2874, val loss 4.2823
iter 0: loss 4.2655, time 1500.00ms, mfu -100.00%
iter 1: loss 4.1000, time 50.00ms, mfu -100.00%
iter 2: loss 3.9000, time 70.00ms, mfu 0.10%
step 3: train loss 3.5000, val loss 3.6000
iter 3: loss 3.4000, time 380.00ms, mfu 0.10%
"""


def test_loop_time_counts_every_iteration_and_its_evaluation():
    found = nanogpt.parse_nanogpt(LOG)
    assert found["seconds"] == pytest.approx(1.5 + 0.05 + 0.07 + 0.38)
    assert found["tokens"] == 4 * 12 * 64 and found["val_loss"] == 3.6


def test_a_log_without_iterations_is_an_error_not_a_zero():
    with pytest.raises(UserError, match="no 'iter N"):
        nanogpt.parse_nanogpt("Traceback (most recent call last):\nModuleNotFoundError: tiktoken\n")


def test_ratios_are_taken_within_each_round():
    rounds = [{"nanogpt": {"tokens_per_sec": 100.0}, "eager": {"tokens_per_sec": 90.0}},
              {"nanogpt": {"tokens_per_sec": 50.0}, "eager": {"tokens_per_sec": 55.0}}]
    summary = nanogpt.summarize(rounds)
    assert summary["eager / nanogpt"]["ratios"] == [0.9, 1.1] and summary["eager / nanogpt"]["interval"] is None
    assert "compiled / nanogpt" not in summary


def test_a_directory_that_is_not_nanogpt_is_refused(tmp_path, capsys):
    assert bench_nanogpt.main(["--nanogpt", str(tmp_path), "--rounds", "1"]) == 2
    assert "needs nanoGPT's train.py" in capsys.readouterr().err


FAKE_MODEL = '''
from dataclasses import dataclass
import torch
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float
    bias: bool


class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        print("number of parameters: 0.00M")
        self.emb = torch.nn.Embedding(config.vocab_size, config.n_embd)
        self.head = torch.nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx, targets):
        assert idx.is_contiguous() and targets.is_contiguous()  # nanoGPT views them
        logits = self.head(self.emb(idx))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        print("num decayed parameter tensors: 2")
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
'''


def test_paired_steps_time_both_models_in_turn_and_profile_them(tmp_path, capsys):
    """--paired builds nanoGPT's GPT from the checkout's model.py and ours from the recipe;
    here a stand-in model.py with nanoGPT's interface."""
    (tmp_path / "model.py").write_text(FAKE_MODEL)
    found = nanogpt.paired_steps(tmp_path, steps=2, warmup=1, profile_ops=3, kinds=("rope", "none"))
    assert found["steps"] == 2 and found["nanogpt_step_ms"] > 0 and set(found["ours"]) == {"rope", "none"}
    for row in found["ours"].values():
        assert row["step_ms"] > 0 and row["speed_ratio"] > 0
        assert row["interval"] is None  # 2 pairs: too few for a distribution-free interval
    assert set(found["profiles"]) == {"nanogpt", "rope", "none"}
    assert all(len(ops) == 3 and ops[0]["self_cpu_ms_per_step"] > 0 for ops in found["profiles"].values())
    assert "num decayed" not in capsys.readouterr().out  # nanoGPT's own printing is kept out of the report
    nanogpt.print_paired(found)
    assert "ours, none:" in capsys.readouterr().out
