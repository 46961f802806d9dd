"""T5 bias, KERPLE and FIRE against values worked out by hand from each paper's formula.

Causality, parity with the reference forward and cached decoding are checked for every
encoding in test_model.py and test_generation.py; this file checks the biases themselves,
FIRE on both sides of its threshold, and that the learned parameters learn.
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.models import tiny_config
from ropelab.model.config import FireConfig, T5BiasConfig
from ropelab.model.generate import generate
from ropelab.model.positional.t5 import t5_bucket
from ropelab.model.transformer import Transformer
from helpers.models import sharp_model
from helpers.reference import cached_logits

# T5 (Raffel et al. 2020): 32 buckets up to 128. n < 16 is its own bucket; beyond,
# 16 + floor(ln(n/16) / ln(128/16) * 16), capped at 31 — e.g. n = 20: ln 1.25 / ln 8 · 16
# = 1.72 → 17; n = 45: ln 2.8125 / ln 8 · 16 = 7.96 → 23; n = 100: 14.10 → 30.
T5_BUCKETS = {0: 0, 5: 5, 15: 15, 16: 16, 17: 16, 20: 17, 23: 18, 31: 21, 32: 21, 45: 23,
              63: 26, 64: 26, 100: 30, 127: 31, 128: 31, 5000: 31}


def test_t5_buckets_by_hand():
    distances = torch.tensor(list(T5_BUCKETS))
    assert t5_bucket(distances, 32, 128).tolist() == list(T5_BUCKETS.values())
    # 4 buckets up to 8: exact 0, 1; then 2 + floor(ln(n/2)/ln 4 · 2): n=3 → 2, n=4 → 3, n=7 → 3.
    assert t5_bucket(torch.arange(10), 4, 8).tolist() == [0, 1, 2, 2, 3, 3, 3, 3, 3, 3]
    assert t5_bucket(torch.tensor([-3]), 32, 128).tolist() == [0]  # the future counts as distance 0


def test_t5_bias_reads_one_shared_table():
    model = Transformer(tiny_config("t5"))
    with torch.no_grad():
        model.pos.weight.copy_(torch.arange(4 * 32, dtype=torch.float32).view(4, 32))
    own = [n for n, _ in model.named_parameters() if n.startswith("pos.")]
    assert own == ["pos.weight"] and model.pos.weight.shape == (4, 32)  # one table for all layers
    bias = model.pos.bias(torch.tensor([20, 150]), torch.arange(151))  # (H, 2, 151)
    assert bias.dtype == torch.float32 and bias.shape == (4, 2, 151)
    for h in range(4):
        assert bias[h, 0, 0] == 32 * h + 17  # distance 20
        assert bias[h, 0, 20] == 32 * h  # distance 0
        assert bias[h, 1, 5] == 32 * h + 31  # distance 145: beyond max_distance
        assert bias[h, 1, 105] == 32 * h + 23  # distance 45


def test_t5_init_follows_transformers():
    model = Transformer(tiny_config("t5", d_model=64))  # N(0, d_model^-1/2): std 0.125
    assert model.pos.weight.std().item() == pytest.approx(0.125, rel=0.2)
    small = tiny_config("t5")
    small.pos.t5 = T5BiasConfig(num_buckets=4, max_distance=8)
    assert Transformer(small).pos.weight.shape == (4, 4)


def kerple_model() -> Transformer:
    model = Transformer(tiny_config("kerple"))
    with torch.no_grad():
        model.pos.r1.copy_(torch.tensor([0.5, 1.5, 1.0, 2.0]))
        model.pos.r2.copy_(torch.tensor([2.0, 0.25, 1.0, 0.5]))
    return model


def test_kerple_log_bias_by_hand():
    bias = kerple_model().pos.bias(torch.tensor([3, 10]), torch.arange(11))
    # -r1 · ln(1 + r2 · d): head 0 at d = 3: -0.5 · ln 7; head 1 at d = 10: -1.5 · ln 3.5.
    assert bias[0, 0, 0].item() == pytest.approx(-0.9729551, abs=1e-6)
    assert bias[1, 1, 0].item() == pytest.approx(-1.8791445, abs=1e-6)
    assert bias[:, 0, 3].abs().max() == 0  # distance 0


def test_kerple_keeps_its_parameters_positive():
    model = kerple_model()
    with torch.no_grad():
        model.pos.r1[0] = -1.0
    model.eval()
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 8)))
    assert model.pos.r1[0] == -1.0  # evaluation reads a clamped value, changes nothing
    assert model.pos.bias(torch.tensor([1]), torch.tensor([0]))[0, 0, 0].item() == pytest.approx(-0.01 * 1.0986123)
    model.train()
    model(torch.randint(0, 97, (1, 8)), targets=torch.randint(0, 97, (1, 8))).backward()
    assert model.pos.r1[0].item() == pytest.approx(0.01)  # projected onto r ≥ 0.01, as the authors do
    assert model.pos.r1.grad is not None and model.pos.r2.grad.abs().sum() > 0


def fire_model(threshold: float = 4.0) -> Transformer:
    """One hidden unit, f(x)_h = (h + 1) · relu(x): the bias is (h + 1) · ψ(i−j) / ψ(max(L, i))."""
    cfg = tiny_config("fire")
    cfg.pos.fire = FireConfig(mlp_width=1, init_c=0.1, threshold=threshold)
    model = Transformer(cfg)
    first, last = model.pos.mlp[0], model.pos.mlp[2]
    with torch.no_grad():
        first.weight.fill_(1.0)
        first.bias.zero_()
        last.weight.copy_(torch.arange(1.0, 5.0).view(4, 1))
        last.bias.zero_()
    return model


def test_fire_bias_by_hand_on_both_sides_of_the_threshold():
    fire = fire_model(threshold=4.0).pos
    heads = torch.arange(1.0, 5.0)
    # ψ(x) = ln(0.1 x + 1). Query 10 > L: ψ(6)/ψ(10) = ln 1.6 / ln 2 = 0.6780719.
    beyond = fire.bias(torch.tensor([10]), torch.tensor([4]))  # fit_len 11 > L + 1: pairwise path
    assert torch.allclose(beyond[:, 0, 0], 0.6780719 * heads, atol=1e-5)
    # Queries at or below L = 4 share ψ(4): ψ(1)/ψ(4) = 0.2832631, ψ(2)/ψ(4) = 0.5418621,
    # ψ(3)/ψ(4) = 0.7797501.
    within = fire.prepare_bias(4, torch.device("cpu"))(torch.tensor([2, 3]), torch.tensor([0, 1]))  # per-distance table
    assert torch.allclose(within[:, 0, 1], 0.2832631 * heads, atol=1e-5)
    assert torch.allclose(within[:, 1, 1], 0.5418621 * heads, atol=1e-5)
    assert torch.allclose(within[:, 1, 0], 0.7797501 * heads, atol=1e-5)


def test_fire_table_and_pairwise_paths_agree_below_the_threshold():
    fire = Transformer(tiny_config("fire")).pos  # default L = 512, random MLP
    positions = torch.arange(64)
    table = fire.prepare_bias(64, positions.device)(positions, positions)
    pairwise = fire.pairwise_bias(positions, positions)
    assert torch.allclose(table, pairwise, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 5])
def test_fire_cached_decoding_across_the_threshold(chunk):
    cfg = tiny_config("fire")
    cfg.pos.fire = FireConfig(threshold=8.0)
    model = sharp_model(cfg)
    x = torch.randint(0, 97, (2, 29))
    with torch.no_grad():
        assert torch.allclose(cached_logits(model, x, chunk), model(x), atol=1e-5)
    prompt = x[:, :5]
    assert torch.equal(generate(model, prompt, 20, temperature=0), generate(model, prompt, 20, temperature=0,
                                                                            use_cache=False))


def test_fire_learns_c_and_the_threshold():
    model = Transformer(tiny_config("fire"))
    x = torch.randint(0, 97, (2, 16))
    model(x, targets=torch.randint(0, 97, (2, 16))).backward()
    assert model.pos.c.grad.abs() > 0 and model.pos.threshold_scale.grad.abs() > 0


@pytest.mark.parametrize("kind", ["t5", "kerple", "fire", "alibi"])
def test_biases_stay_float32_under_bf16_autocast(kind):
    model = Transformer(tiny_config(kind))
    q, k = torch.arange(600, 700), torch.arange(700)
    with torch.no_grad():
        plain = model.pos.prepare_bias(700, q.device)(q, k)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model.pos.prepare_bias(700, q.device)(q, k)
    assert autocast.dtype == torch.float32 and torch.equal(autocast, plain)


# ------------------------------------------------- scripts/position_bias.py

def test_relative_bias_by_hand():
    from ropelab.scripts.position_bias import distances, relative_bias
    assert distances(2048) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2047]
    assert distances(9) == [1, 2, 4, 8] and distances(1) == []
    # ALiBi, 4 heads: slopes 1/4, 1/16, 1/64, 1/256; the bias is −slope · d.
    rel = relative_bias(Transformer(tiny_config("alibi")).pos, 200)
    slopes = torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8])
    assert torch.allclose(rel, -slopes[:, None] * torch.arange(200.0), atol=1e-4)
    # T5: table value (h, bucket) = 10h + bucket, so at distance d the relative bias is
    # bucket(d) − bucket(0) = T5_BUCKETS[d] for every head.
    model = Transformer(tiny_config("t5"))
    with torch.no_grad():
        model.pos.weight.copy_(10 * torch.arange(4.0)[:, None] + torch.arange(32.0))
    rel = relative_bias(model.pos, 6000)
    for d, bucket in T5_BUCKETS.items():
        assert rel[:, d].tolist() == [float(bucket)] * 4, d


def test_position_bias_cli(tmp_path, corpus, capsys):
    from ropelab import train
    from helpers.runs import write_run_config
    from ropelab.scripts import position_bias
    cfg = write_run_config(tmp_path, corpus)
    for kind in ("t5", "rope"):
        assert train.main([str(cfg), f"model.pos.kind={kind}", f"name={kind}", "train.max_steps=2",
                           "train.eval_interval=2", "train.ckpt_interval=2"]) == 0
    capsys.readouterr()
    runs = tmp_path / "runs"
    out, png = tmp_path / "bias.json", tmp_path / "figs" / "bias.png"
    assert position_bias.main([str(runs / "t5"), str(runs / "rope"), "--length", "100", "--json", str(out),
                               "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr()
    assert "t5 (t5; query at 99)" in printed.out and "| 3 |" in printed.out
    assert "no fixed score bias" in printed.err and "rope" in printed.err
    [record] = json.loads(out.read_text())
    assert record["distances"][-1] == 99 and len(record["relative_bias"]) == 4
    # Bad input: no run with a bias, no such run.
    assert position_bias.main([str(runs / "rope")]) == 2
    assert "none of the runs adds a bias" in capsys.readouterr().err
    assert position_bias.main([str(runs / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
