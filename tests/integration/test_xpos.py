"""xPos against its formula worked out by hand, its range, and float16's tighter one.

Cached decoding equal to the full forward (keys scaled at their own positions) is checked
with every encoding in test_generation.py, including a strong-decay xPos variant and xPos
with dynamic NTK and YaRN. A RoPE scaling acts on xPos's rotation only (model/encodings.py):
checked here on the rotation and through evaluation.
"""

from __future__ import annotations

import math

import pytest
import torch

from ropelab import train
from helpers.models import tiny_config
from helpers.runs import write_run_config
from ropelab.configs.schema import EvalConfig
from ropelab.eval.lm.extrapolation import run_extrapolation
from ropelab.model.config import RopeScalingConfig, XposConfig
from ropelab.common.errors import LengthError
from ropelab.model.generate import generate
from ropelab.model.positional.xpos import XPos
from ropelab.model.transformer import Transformer

SCALE_BASE = 8.0  # small, so the decay is large enough to see


def xpos(scale_base: float = SCALE_BASE, pairing: str = "interleaved") -> XPos:
    cfg = tiny_config("xpos", pairing=pairing, d_model=16, n_heads=4, n_kv_heads=4)  # head_dim 4
    cfg.pos.xpos = XposConfig(scale_base=scale_base, gamma=0.4)
    return XPos(cfg)


def score_by_hand(q: list[float], k: list[float], n: int, m: int) -> float:
    """Sun et al. 2022 with head_dim 4, interleaved pairs (0,1), (2,3):
    Σ_i ζ_i^((n−m)/B) · (R(nθ_i) q_i) · (R(mθ_i) k_i), θ_i = 10000^(−2i/4), ζ_i = (2i/4 + 0.4)/1.4."""
    total = 0.0
    for i, theta in enumerate((1.0, 0.01)):
        zeta = (2 * i / 4 + 0.4) / 1.4
        qx, qy, kx, ky = q[2 * i], q[2 * i + 1], k[2 * i], k[2 * i + 1]
        a, b = n * theta, m * theta
        rq = (qx * math.cos(a) - qy * math.sin(a), qx * math.sin(a) + qy * math.cos(a))
        rk = (kx * math.cos(b) - ky * math.sin(b), kx * math.sin(b) + ky * math.cos(b))
        total += zeta ** ((n - m) / SCALE_BASE) * (rq[0] * rk[0] + rq[1] * rk[1])
    return total


def score(enc: XPos, q: list[float], k: list[float], n: int, m: int, fit_len: int) -> float:
    """q at position n against k at m, rotated and scaled by the encoding."""
    qs = torch.tensor([q, q]).view(1, 1, 2, 4)
    ks = torch.tensor([k, k]).view(1, 1, 2, 4)
    rq, rk = enc.rotation(torch.tensor([n, m]), fit_len)(qs, ks)
    return float(rq[0, 0, 0] @ rk[0, 0, 1])


@pytest.mark.parametrize("n, m, fit_len", [(3, 1, 8), (20, 2, 32), (30, 30, 31), (50, 0, 64)])
def test_score_matches_the_formula(n, m, fit_len):
    q, k = [0.3, -1.2, 0.8, 0.5], [1.1, 0.4, -0.6, 0.9]
    assert score(xpos(), q, k, n, m, fit_len) == pytest.approx(score_by_hand(q, k, n, m), rel=1e-5, abs=1e-6)


def test_scores_depend_on_the_offset_only_and_decay():
    enc, q = xpos(), [1.0, 0.0, 1.0, 0.0]
    near = score(enc, q, q, 13, 11, 64)
    assert score(enc, q, q, 3, 1, 8) == pytest.approx(near, rel=1e-5)  # another centre, same offset
    assert score(enc, q, q, 60, 58, 64) == pytest.approx(near, rel=1e-5)
    # The slow pair alone (θ = 0.01: barely turned over 40 positions) loses score as
    # ζ_1^(offset/B) = 0.643^(offset/8).
    slow = [0.0, 0.0, 1.0, 0.0]
    assert score(enc, slow, slow, 40, 0, 64) < score(enc, slow, slow, 20, 0, 64) < score(enc, slow, slow, 0, 0, 64)


def test_half_pairing_matches_interleaved_after_permuting_dims():
    q, k = torch.randn(4), torch.randn(4)
    perm = [0, 2, 1, 3]  # half pairs (0,2), (1,3) hold the interleaved pairs (0,1), (2,3)
    inter, half = xpos(pairing="interleaved"), xpos(pairing="half")
    a = score(inter, q.tolist(), k.tolist(), 17, 5, 32)
    b = score(half, q[perm].tolist(), k[perm].tolist(), 17, 5, 32)
    assert a == pytest.approx(b, rel=1e-5)


def test_longer_than_the_float_range_is_refused():
    # scale_base 1: |n − c| ≤ floor(64 ln 2 / ln 3.5) = 35, so at most 2·35 + 1 = 71 positions.
    cfg = tiny_config("xpos")
    cfg.pos.xpos = XposConfig(scale_base=1.0)
    assert cfg.pos.xpos.max_len == 71 and XposConfig().max_len == 36261
    model = Transformer(cfg).eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 97, (1, 71)))).all()
        with pytest.raises(LengthError, match="at most 71 positions"):
            model(torch.randint(0, 97, (1, 72)))
    with pytest.raises(LengthError, match="at most 71"):
        generate(model, [1, 2, 3], 69)
    with pytest.raises(LengthError):
        model.setup_cache(1, 72)


def test_float16_is_refused_where_its_range_ends():
    enc = xpos(scale_base=1.0)
    q = torch.randn(1, 1, 10, 4)
    # fit_len 10: centre 5, largest scale 3.5^5 ≈ 525 > 2^8.
    with pytest.raises(LengthError, match="float16"):
        enc.rotation(torch.arange(10), 10)(q.half(), q.half())
    out, _ = enc.rotation(torch.arange(8), 8)(q[:, :, :8].half(), q[:, :, :8].half())  # 3.5^4 ≈ 150
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    enc.rotation(torch.arange(10), 10)(q.bfloat16(), q.bfloat16())  # bf16 has float32's range


def test_a_scaling_turns_the_rotation_and_leaves_the_decay():
    """Position interpolation (s = 4) divides every angle by 4; the scales ζ^((n−c)/B) stay."""
    plain = xpos()
    cfg = tiny_config("xpos", pairing="interleaved", d_model=16, n_heads=4, n_kv_heads=4,
                      scaling=RopeScalingConfig(type="linear", factor=4.0, original_max_len=8))
    cfg.pos.xpos = XposConfig(scale_base=SCALE_BASE, gamma=0.4)
    scaled, positions = XPos(cfg), torch.arange(0, 40, 4)
    ours = scaled.rotation(positions, 40)
    unscaled, quarter = plain.rotation(positions, 40), plain.rotation(positions // 4, 40)
    assert torch.allclose(ours.q_cos ** 2 + ours.q_sin ** 2, unscaled.q_cos ** 2 + unscaled.q_sin ** 2, rtol=1e-5)
    assert not torch.allclose(ours.q_cos, unscaled.q_cos, atol=1e-3)
    assert torch.allclose(torch.atan2(ours.q_sin, ours.q_cos), torch.atan2(quarter.q_sin, quarter.q_cos), atol=1e-5)


def test_an_xpos_run_is_evaluated_under_every_scaling(tmp_path, corpus):
    cfg = str(write_run_config(tmp_path, corpus))
    assert train.main([cfg, "train.max_steps=4", "train.eval_interval=4", "train.ckpt_interval=4",
                       "model.pos.kind=xpos", "name=xpos"]) == 0
    ev = EvalConfig(lengths=[32, 64], scalings=["none", "ntk", "dynamic"], max_tokens=512, per_position=False)
    results = run_extrapolation([tmp_path / "runs" / "xpos"], tmp_path / "report", lambda c: ev)
    rows = {(r["scaling"], r["length"]): r for r in results["results"]}
    assert set(rows) == {(s, n) for s in ("none", "ntk", "dynamic") for n in (32, 64)}
    assert rows[("ntk", 32)]["nll"] == rows[("none", 32)]["nll"]  # at the training length: plain
    assert rows[("ntk", 64)]["nll"] != rows[("none", 64)]["nll"]
    # Dynamic NTK fitted to 64 is NTK with s = 2: the same rotation, so scored once.
    assert rows[("dynamic", 64)]["same_as"] == "ntk" and rows[("dynamic", 64)]["nll"] == rows[("ntk", 64)]["nll"]
    assert "xpos + ntk" in (tmp_path / "report" / "report.md").read_text()
