"""Randomized positions (Ruoss et al. 2023): the draws, per-sequence positions in every
encoding, and the training loop that uses them (resume stays bit-exact)."""

from __future__ import annotations

import signal

import pytest
import torch

from ropelab import train
from ropelab.configs import load_config
from helpers.models import ALL_KINDS, tiny_config
from helpers.runs import write_run_config
from ropelab.data.samplers import RandomPositions
from ropelab.common.errors import ArgumentError
from ropelab.model.transformer import Transformer
from helpers import ROOT
from helpers.runs import records, stop_after


def test_draws_are_sorted_subsets_and_a_pure_function_of_seed_and_batch():
    draws = RandomPositions(max_len=50, seq_len=12, batch_size=4, seed=3)
    batch = draws.batch(7)
    assert batch.shape == (4, 12) and batch.dtype == torch.int64
    assert (batch[:, 1:] > batch[:, :-1]).all() and batch.min() >= 0 and batch.max() < 50
    assert torch.equal(RandomPositions(50, 12, 4, seed=3).batch(7), batch)  # no hidden state
    assert not torch.equal(draws.batch(8), batch) and not torch.equal(RandomPositions(50, 12, 4, seed=4).batch(7), batch)
    assert len({tuple(row) for row in batch.tolist()}) == 4  # every sequence its own positions
    # Two ranks with batch 2 see exactly the rows of one rank with batch 4.
    halves = [RandomPositions(50, 12, 2, seed=3, rank=r, world_size=2).batch(7) for r in (0, 1)]
    assert torch.equal(torch.cat(halves), batch)
    assert torch.equal(RandomPositions(12, 12, 2, seed=0).batch(0), torch.arange(12).expand(2, 12))


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_per_sequence_positions_equal_one_forward_per_sequence(kind):
    """(B, T) positions through embed, rotation, bias and masks, fused and query-chunked."""
    model = Transformer(tiny_config(kind)).eval()
    x = torch.randint(0, 97, (3, 20))
    positions = torch.stack([torch.randperm(60)[:20].sort().values for _ in range(3)])
    with torch.no_grad():
        one_by_one = torch.cat([model(x[b:b + 1], positions[b]) for b in range(3)])
        assert torch.allclose(model(x, positions), one_by_one, atol=1e-5)
        for block in model.blocks:
            block.attn.query_chunk = 7
        assert torch.allclose(model(x, positions), one_by_one, atol=1e-5)
        shared = positions[0].expand(3, 20)  # the (B, T) path with equal rows is the (T,) path
        assert torch.allclose(model(x, shared), model(x, positions[0]), atol=1e-5)


@pytest.mark.parametrize("kind", ["rope", "alibi", "t5", "fire", "xpos"])
def test_per_sequence_positions_stay_causal(kind):
    model = Transformer(tiny_config(kind)).eval()
    for block in model.blocks:
        block.attn.query_chunk = 6  # the explicit (B, 1, tq, Tk) masks of the chunked path
    x = torch.randint(0, 97, (2, 16))
    positions = torch.stack([torch.randperm(100)[:16].sort().values for _ in range(2)])
    changed = x.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 97
    with torch.no_grad():
        a, b = model(x, positions), model(changed, positions)
    assert torch.equal(a[:, :9], b[:, :9]) and not torch.allclose(a[:, 9:], b[:, 9:])


def test_per_sequence_positions_are_refused_with_a_cache():
    model = Transformer(tiny_config()).eval()
    model.setup_cache(2, 16)
    with pytest.raises(ArgumentError, match="training path"):
        model(torch.zeros(2, 4, dtype=torch.long), torch.arange(4).expand(2, 4))
    model.clear_cache()


def test_training_feeds_each_sequence_its_draw_and_resumes_bit_exactly(tmp_path, corpus, monkeypatch):
    cfg = write_run_config(tmp_path, corpus)  # seq_len 32, batch 8, seed 7
    args = [str(cfg), "train.max_steps=12", "train.random_positions.max_len=128", "model.pos.kind=alibi"]
    seen = []
    forward = Transformer.forward

    def spy(self, idx, positions=None, **kw):
        if self.training:
            seen.append(positions)
        return forward(self, idx, positions, **kw)

    with monkeypatch.context() as m:
        m.setattr(Transformer, "forward", spy)
        assert train.main([*args, "name=straight"]) == 0
    assert len(seen) == 12 and all(p.shape == (8, 32) for p in seen)
    assert torch.equal(seen[3], RandomPositions(128, 32, 8, seed=7).batch(3))
    assert int(max(p.max() for p in seen)) > 32  # positions beyond the training length were trained
    with monkeypatch.context() as m:
        stop_after(5, m)
        assert train.main([*args, "name=broken"]) == 128 + signal.SIGTERM
    assert train.main([*args, "name=broken", "--resume"]) == 0
    runs = tmp_path / "runs"
    assert records(runs / "broken") == records(runs / "straight")  # every logged loss identical
    plain = train.main([str(cfg), "train.max_steps=12", "model.pos.kind=alibi", "name=plain"])
    assert plain == 0 and records(runs / "plain") != records(runs / "straight")


def test_learned_table_defaults_to_the_random_range():
    cfg = load_config([ROOT / "configs" / "quickstart.yaml", ROOT / "configs" / "pe" / "learned.yaml"],
                      ["train.random_positions.max_len=512"])
    assert cfg.model.pos.max_len == 512 and cfg.train.random_positions.max_len == 512
    assert load_config(ROOT / "configs" / "quickstart.yaml").train.random_positions is None


def test_bad_ranges_exit_2_before_any_work(tmp_path, corpus, capsys):
    cfg = write_run_config(tmp_path, corpus)
    assert train.main([str(cfg), "train.random_positions.max_len=16"]) == 2
    assert "smaller than train.seq_len=32" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
