"""CoPE (Golovneva et al. 2024): gated counts as positions, checked against hand-worked values.

Causality, cached decoding, query chunks, per-sequence positions and the slow reference
forward (tests/helpers/reference.py: the triangular-matmul counts and interpolated embeddings)
cover CoPE with every other kind in test_model, test_generation and test_positional.
"""

from __future__ import annotations

import math

import pytest
import torch

from ropelab import train
from helpers.models import tiny_config
from helpers.runs import write_run_config
from ropelab.model.config import CopeConfig, ModelConfig, PosConfig
from ropelab.common.errors import ConfigError
from ropelab.model.transformer import Transformer
from ropelab.training.saved_run import load_run


def cope_model() -> Transformer:
    """tiny_config's CoPE: cap 8, random tables (init_std 1)."""
    return Transformer(tiny_config("cope"))


def test_bias_by_hand():
    """One query (i = 2) over keys 0, 1, 2 with logits 0, ln 3, −ln 3: gates 1/2, 3/4, 1/4.

    p_22 = 1/4, p_21 = 3/4 + 1/4 = 1, p_20 = 1/2 + 1 = 3/2. With e[0] = (1, 0), e[1] = (0, 1),
    e[2] = (2, 2) and q = (1, 3): q·e[n] = 1, 3, 8, so the biases are
    3/4·1 + 1/4·3 = 1.5 (j = 2), 3 (j = 1) and 1/2·3 + 1/2·8 = 5.5 (j = 0).
    """
    cfg = ModelConfig(vocab_size=11, d_model=2, n_layers=2, n_heads=1, pos=PosConfig(kind="cope"))
    cfg.pos.cope = CopeConfig(max_pos=3)
    model = Transformer(cfg)
    with torch.no_grad():
        model.pos.weight[1] = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    q = torch.tensor([1.0, 3.0]).view(1, 1, 1, 2)
    logits = torch.tensor([0.0, math.log(3), -math.log(3)]).view(1, 1, 1, 3)
    assert model.pos.positions(logits).flatten().tolist() == pytest.approx([1.5, 1.0, 0.25])
    bias = model.pos.contextual_bias(1, q, logits).flatten()
    assert bias.tolist() == pytest.approx([5.5, 3.0, 1.5])
    assert model.pos.contextual_bias(0, q, logits).abs().max() == 0  # layer 0's table is still zero
    # A key after the query (logit −inf) has gate 0: it adds nothing to any count.
    masked = torch.tensor([0.0, math.log(3), -math.log(3), float("-inf")]).view(1, 1, 1, 4)
    assert model.pos.positions(masked).flatten().tolist() == pytest.approx([1.5, 1.0, 0.25, 0.0])
    # Capped at max_pos − 1 = 1: key 0 now sits at 1 as well.
    cfg.pos.cope = CopeConfig(max_pos=2)
    capped = Transformer(cfg)
    with torch.no_grad():
        capped.pos.weight[1] = model.pos.weight[1, :2]
    assert capped.pos.contextual_bias(1, q, logits).flatten().tolist() == pytest.approx([3.0, 3.0, 1.5])


def test_starts_as_nope_and_learns_every_layer():
    """The paper's zero init adds nothing, so the model computes what NoPE's would; the
    embeddings of every layer still get a gradient, and so do the gates through p."""
    cfg = tiny_config("cope")
    cfg.pos.cope = CopeConfig(max_pos=8)  # init_std 0: the paper's zeros
    cope = Transformer(cfg)
    nope = Transformer(tiny_config("none"))
    state = {k: v for k, v in cope.state_dict().items() if not k.startswith("pos.")}
    nope.load_state_dict(state)
    assert cope.pos.weight.abs().max() == 0
    x, y = torch.randint(0, 97, (2, 24)), torch.randint(0, 97, (2, 24))
    with torch.no_grad():
        assert torch.allclose(cope(x), nope(x), atol=1e-5)
    cope(x, targets=y).backward()
    per_layer = cope.pos.weight.grad.abs().sum(dim=(1, 2))
    assert (per_layer > 0).all()
    # Once the embeddings are non-zero, the gates (hence q and k) get CoPE's gradient too.
    model = cope_model()
    model(x, targets=y).backward()
    wq_grad = model.blocks[0].attn.wqkv.weight.grad.clone()
    with torch.no_grad():
        model.pos.weight.zero_()
    model.zero_grad()
    model(x, targets=y).backward()
    assert not torch.allclose(wq_grad, model.blocks[0].attn.wqkv.weight.grad)


def test_contextual_path_stays_float32_under_bf16_autocast(monkeypatch):
    model = cope_model().eval()
    seen = []
    real = type(model.pos).contextual_bias

    def spy(self, layer, q, logits, bias=None):
        out = real(self, layer, q, logits, bias)
        seen.append((layer, q.dtype, logits.dtype, out.dtype))
        return out

    monkeypatch.setattr(type(model.pos), "contextual_bias", spy)
    x = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        plain = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = model(x)
    assert [s[0] for s in seen] == [0, 1, 0, 1]  # each block reads its own layer's table
    assert all(s[1:] == (torch.float32,) * 3 for s in seen)
    assert mixed.dtype == torch.bfloat16 and torch.allclose(mixed.float(), plain, atol=0.1)


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.pos.kind=cope", "model.pos.cope.max_pos=1"], "pos.cope.max_pos must be at least 2"),
    (["model.pos.kind=cope", "model.pos.cope.init_std=-1"], "pos.cope.init_std must be a finite number"),
    (["model.pos.kind=cope", "model.attention=linear"], "no attention matrix to bias"),
    (["model.pos.kind=cope", "train.random_positions.max_len=64"], "CoPE counts positions from the content"),
])
def test_bad_settings_exit_2(tmp_path, corpus, capsys, overrides, message):
    cfg = write_run_config(tmp_path, corpus)
    assert train.main([str(cfg), *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # refused before any work


def test_config_rejects_in_python_too():
    with pytest.raises(ConfigError, match="at least 2"):
        CopeConfig(max_pos=0)
    with pytest.raises(ConfigError, match="init_std"):
        CopeConfig(init_std=float("inf"))


def test_trains_from_the_cli_with_its_own_learning_rate(tmp_path, corpus):
    """A run trains; its embeddings leave the paper's zeros (at 10× the lr, as a learned encoding)."""
    cfg = write_run_config(tmp_path, corpus)
    assert train.main([str(cfg), "model.pos.kind=cope", "train.max_steps=4", "train.eval_interval=4",
                       "train.ckpt_interval=4", "train.pos_lr_multiplier=10"]) == 0
    run = load_run(tmp_path / "runs" / "tiny")
    weight = run.model.pos.weight
    assert weight.shape == (2, 64, 8) and weight.abs().max() > 0
