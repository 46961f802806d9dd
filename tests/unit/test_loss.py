"""The chunked LM-head cross-entropy equals the plain definition, values and gradients."""

import pytest
import torch
import torch.nn.functional as F

import ropelab.model.loss as loss_mod
from ropelab.model.config import ModelConfig, PosConfig
from ropelab.model.loss import linear_cross_entropy
from ropelab.model.transformer import Transformer


@pytest.fixture
def small_chunks(monkeypatch):
    # 7 rows per chunk at V=97: several chunks and a ragged last one.
    monkeypatch.setattr(loss_mod, "CHUNK_BYTES", 7 * 4 * 97)


def _inputs(n=40, d=16, vocab=97, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(vocab, d, generator=g, dtype=torch.float64).requires_grad_()
    y = torch.randint(0, vocab, (n,), generator=g)
    return h, w, y


def test_chunking_really_chunks(small_chunks):
    assert loss_mod.chunk_rows(40, 97) == 7


@pytest.mark.parametrize("chunked", [False, True])
def test_mean_loss_and_gradients_match_cross_entropy(request, chunked):
    if chunked:
        request.getfixturevalue("small_chunks")
    h, w, y = _inputs()
    ref = F.cross_entropy(h @ w.t(), y)
    ref_grads = torch.autograd.grad(ref * 3.0, (h, w))  # a non-unit upstream gradient
    out = linear_cross_entropy(h, w, y)
    grads = torch.autograd.grad(out * 3.0, (h, w))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_per_target_loss_matches_and_keeps_shape(small_chunks):
    h, w, y = _inputs()
    h3, y3 = h.detach().view(4, 10, 16), y.view(4, 10)
    out = linear_cross_entropy(h3, w.detach(), y3, reduction="none")
    ref = F.cross_entropy((h3 @ w.detach().t()).flatten(0, 1), y3.flatten(), reduction="none").view(4, 10)
    assert out.shape == (4, 10)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(h3, w, y3, reduction="sum")


def test_no_grad_mean_matches(small_chunks):
    h, w, y = _inputs()
    with torch.no_grad():
        out = linear_cross_entropy(h, w, y)
        ref = F.cross_entropy(h @ w.t(), y)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tie", [True, False])
def test_model_targets_path_equals_logits_path(small_chunks, tie):
    """Loss and every parameter gradient through model(x, targets=y) equal the logits route."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, tie_embeddings=tie,
                      pos=PosConfig(kind="rope"))
    model = Transformer(cfg)
    x, y = torch.randint(0, 97, (3, 12)), torch.randint(0, 97, (3, 12))
    ref = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    out = model(x, targets=y)
    grads = torch.autograd.grad(out, list(model.parameters()))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    per_target = model(x, targets=y, reduction="none")
    torch.testing.assert_close(per_target.mean(), ref.detach(), rtol=1e-6, atol=1e-6)


def test_autocast_matmuls_in_bf16_statistics_in_float32(small_chunks):
    """Under autocast (the GPU training path, run here on CPU) the head matmuls use the
    autocast dtype like the unfused reference, while loss and gradients stay float32."""
    h, w, y = (t.float() if t.is_floating_point() else t for t in _inputs())
    h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear_cross_entropy(h, w, y)
        ref = F.cross_entropy((h @ w.t()).float(), y)
    grads, ref_grads = torch.autograd.grad(out, (h, w)), torch.autograd.grad(ref, (h, w))
    assert out.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, ref_grads):  # bf16 rounding in another order: 1% of the scale
        torch.testing.assert_close(a, b, rtol=0, atol=1e-2 * float(b.abs().max()))
    # bf16 matmuls really happened: the float32 result differs.
    assert not torch.allclose(out, F.cross_entropy(h @ w.t(), y), rtol=1e-6, atol=1e-7)


def _with_ignored(y: torch.Tensor, every: int = 3) -> torch.Tensor:
    """``y`` with every ``every``-th target (and a whole ragged chunk's worth) ignored."""
    y = y.clone()
    y[::every] = loss_mod.IGNORE_INDEX
    y[7:14] = loss_mod.IGNORE_INDEX  # one whole 7-row chunk under small_chunks
    return y


def test_ignored_targets_match_cross_entropy_ignore_index(small_chunks):
    """Answer-only losses: values and gradients equal F.cross_entropy(ignore_index=-100),
    and ignored rows get exactly zero gradient."""
    h, w, y = _inputs()
    y = _with_ignored(y)
    ref = F.cross_entropy(h @ w.t(), y, ignore_index=-100)
    ref_grads = torch.autograd.grad(ref * 3.0, (h, w))
    out = linear_cross_entropy(h, w, y)
    grads = torch.autograd.grad(out * 3.0, (h, w))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert bool((grads[0][y == -100] == 0).all())
    none = linear_cross_entropy(h.detach(), w.detach(), y, reduction="none")
    ref_none = F.cross_entropy(h.detach() @ w.detach().t(), y, ignore_index=-100, reduction="none")
    torch.testing.assert_close(none, ref_none, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, y), ref.detach(), rtol=1e-12, atol=1e-12)


def test_all_targets_ignored_is_nan_like_cross_entropy():
    h, w, y = _inputs(n=5)
    y = torch.full_like(y, loss_mod.IGNORE_INDEX)
    assert torch.isnan(F.cross_entropy(h @ w.t(), y)) and torch.isnan(linear_cross_entropy(h, w, y))


def test_model_answer_only_loss_ignores_everything_else():
    """Through the model: the loss equals F.cross_entropy(ignore_index) on the logits, and
    padding after the last scored position changes neither it nor any gradient."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4))
    x, y = torch.randint(0, 97, (2, 12)), torch.randint(0, 97, (2, 12))
    y[:, :5] = loss_mod.IGNORE_INDEX
    y[:, 8:] = loss_mod.IGNORE_INDEX  # scored: positions 5, 6, 7
    ref = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
    out = model(x, targets=y)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    grads = torch.autograd.grad(out, list(model.parameters()))
    x2 = x.clone()
    x2[:, 8:] = (x2[:, 8:] + 1) % 97  # padding after the answer
    out2 = model(x2, targets=y)
    assert out2.item() == out.item()
    for a, b in zip(grads, torch.autograd.grad(out2, list(model.parameters()))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_weighted_mean_and_gradients_match_the_definition(small_chunks):
    """With per-target weights: Σ w·nll / Σ w over the scored targets, values and gradients,
    with and without gradients; the weights' scale does not matter; ignored targets stay out."""
    h, w, y = _inputs()
    y = _with_ignored(y)
    g = torch.Generator().manual_seed(3)
    weights = torch.rand(y.shape, generator=g, dtype=torch.float64) + 0.1
    nll = F.cross_entropy(h @ w.t(), y, ignore_index=-100, reduction="none")
    scored = (y != -100).double()
    ref = (nll * weights * scored).sum() / (weights * scored).sum()
    ref_grads = torch.autograd.grad(ref * 2.0, (h, w))
    out = linear_cross_entropy(h, w, y, weights=weights)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(out * 2.0, (h, w)), ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(linear_cross_entropy(h, w, y, weights=weights * 7.0), ref, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, y, weights=weights), ref.detach(), rtol=1e-12,
                                   atol=1e-12)
    # Equal weights are the plain mean.
    torch.testing.assert_close(linear_cross_entropy(h, w, y, weights=torch.full(y.shape, 0.3, dtype=torch.float64)),
                               linear_cross_entropy(h, w, y), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="weights go with reduction='mean'"):
        linear_cross_entropy(h, w, y, reduction="none", weights=weights)
    with pytest.raises(ValueError, match="the targets' shape"):
        linear_cross_entropy(h, w, y, weights=weights[:5])


def test_model_weighted_loss_through_the_targets_path():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4))
    x, y = torch.randint(0, 97, (2, 12)), torch.randint(0, 97, (2, 12))
    weights = torch.tensor([[1.0] * 12, [3.0] * 12])
    nll = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none").view(2, 12)
    ref = (nll[0].mean() + 3 * nll[1].mean()) / 4
    torch.testing.assert_close(model(x, targets=y, target_weights=weights), ref, rtol=1e-6, atol=1e-6)
