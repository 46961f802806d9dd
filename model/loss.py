"""Cross-entropy of the LM head without materialising the full logits.

For a vocabulary V much larger than d_model the head's logits (N × V) are the largest
tensors of a training step: at batch 16 × 256 tokens and V = 8192 they are 134 MB, and a
plain ``F.cross_entropy`` on them writes log-softmax, then its gradient, then zero-fills
and scatters another N × V buffer, each a fresh allocation the kernel must page in. On a
2-core CPU that was about a third of the step (scripts/bench.py, see README).

Here the head matmul, log-sum-exp, loss and the gradient of the loss with respect to the
logits are done per chunk of rows, and the chunk's contribution to the gradients of the
hidden states and of the head weight is computed right away (the technique of Liger
Kernel's fused linear cross-entropy, Hsu et al. 2024, and Apple's Cut Cross-Entropy,
Wijmans et al. 2024). Backward then only scales the saved gradients by the incoming
one. The FLOPs are those of the unfused head (one forward and two backward matmuls);
peak memory drops from O(N·V) to O(chunk·V).

Softmax statistics are float32 whatever the compute dtype; under autocast the matmuls run
in the autocast dtype and the head-weight gradient is accumulated in float32.

Targets equal to ``IGNORE_INDEX`` are not scored, as with ``F.cross_entropy``'s
``ignore_index``: the mean is over the other targets, and their rows get no gradient.
Synthetic tasks use it so that only answer tokens count (data/tasks/). The mask is applied
arithmetically, never by selecting rows, so no step waits on the device to count them.
Optional per-target ``weights`` make the mean a weighted one, Σ wᵢ·nllᵢ / Σ wᵢ over the
scored targets (``data.mix.loss_share`` gives a batch's task rows their share of the loss
that way, training/data.py).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

# Rows per chunk are chosen so one chunk of float32 logits is about this many bytes.
CHUNK_BYTES = 16 * 2**20  # fastest of 2-32 MB on a 2-core CPU (scripts/bench.py era)
IGNORE_INDEX = -100  # a target that is not scored (PyTorch's default ignore_index)


def chunk_rows(n_rows: int, vocab: int) -> int:
    return max(1, min(n_rows, CHUNK_BYTES // (4 * vocab)))


def _dtypes(h: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(matmul dtype, softmax/accumulation dtype: at least float32)."""
    dtype = h.dtype
    if torch.is_autocast_enabled(h.device.type):
        dtype = torch.get_autocast_dtype(h.device.type)
    return dtype, torch.promote_types(dtype, torch.float32)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Mean NLL of ``h @ weightᵀ`` against ``targets``; gradients computed in forward."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        n, vocab = h.shape[0], weight.shape[0]
        dtype, stat = _dtypes(h)
        w = weight.to(dtype)
        grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device)
        grad_w = torch.zeros(weight.shape, dtype=stat, device=h.device)
        total = torch.zeros((), dtype=stat, device=h.device)
        keep_all, targets = _kept(targets, weights, stat)
        count = keep_all.sum()  # a tensor: dividing by it never waits for the device
        step = chunk_rows(n, vocab)
        for start in range(0, n, step):
            hc, yc = h[start:start + step].to(dtype), targets[start:start + step]
            keep = keep_all[start:start + step, None]  # (n_c, 1): 0 for ignored rows, else the weight
            logp = torch.log_softmax((hc @ w.t()).to(stat), dim=-1)  # (n_c, V)
            total -= (logp.gather(1, yc[:, None]) * keep).sum()
            # d(mean NLL)/d logits = (softmax - onehot) · keep / count (keep: 1 or the
            # target's weight on scored rows, 0 elsewhere), built in place in logp's buffer.
            grad = logp.exp_()
            grad.scatter_add_(1, yc[:, None], grad.new_full((yc.shape[0], 1), -1.0))
            grad = grad.mul_(keep).div_(count).to(dtype)
            grad_h[start:start + step] = grad @ w  # (n_c, d)
            grad_w += (grad.t() @ hc).to(stat)  # (V, d)
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return total / count

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out.to(grad_h.dtype), grad_w * grad_out.to(grad_w.dtype), None, None


def _scored(targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bool mask of scored targets, targets with ignored ones replaced by a valid id 0)."""
    scored = targets != IGNORE_INDEX
    return scored, torch.where(scored, targets, torch.zeros_like(targets))


def _kept(targets: torch.Tensor, weights: Optional[torch.Tensor], dtype: torch.dtype
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(each target's weight in the mean, ``dtype``: 0 where ignored, else 1 or its entry of
    ``weights``; targets with ignored ones replaced by a valid id 0)."""
    scored, targets = _scored(targets)
    keep = scored.to(dtype)
    if weights is not None:
        keep = keep * weights.reshape(-1).to(dtype)
    return keep, targets


def _chunked_nll(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-row NLL ((N,), float32 or wider; 0 for ignored targets) without gradients, one
    chunk of logits at a time."""
    dtype, stat = _dtypes(h)
    w = weight.to(dtype)
    scored, targets = _scored(targets)
    out = torch.empty(h.shape[0], dtype=stat, device=h.device)
    step = chunk_rows(h.shape[0], weight.shape[0])
    for start in range(0, h.shape[0], step):
        logp = torch.log_softmax((h[start:start + step].to(dtype) @ w.t()).to(stat), dim=-1)
        out[start:start + step] = -logp.gather(1, targets[start:start + step, None]).squeeze(1)
    return out * scored


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         reduction: str = "mean", weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Cross-entropy of logits ``h @ weightᵀ`` against ``targets``, never holding all logits.

    ``h`` is (..., d), ``targets`` the matching (...) integer ids, ``weight`` (V, d).
    ``reduction``: ``"mean"`` (a scalar, differentiable) or ``"none"`` (per-target NLL
    shaped like ``targets``, no gradient). Results are float32 (float64 for float64 inputs).
    Targets equal to ``IGNORE_INDEX`` are left out of the mean and read 0 with ``"none"``;
    a mean over no scored target is NaN, as with ``F.cross_entropy``. ``weights`` (shaped
    like ``targets``, ``"mean"`` only): the weighted mean Σ wᵢ·nllᵢ / Σ wᵢ over the scored
    targets; the weights' scale does not matter, only their ratios.
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', not {reduction!r}")
    if weights is not None and (reduction != "mean" or weights.shape != targets.shape):
        raise ValueError(f"weights go with reduction='mean' and the targets' shape {tuple(targets.shape)} "
                         f"(got reduction={reduction!r}, weights {tuple(weights.shape)})")
    flat_h, flat_y = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    if reduction == "none":
        with torch.no_grad():
            return _chunked_nll(flat_h, weight, flat_y).view(targets.shape)
    needs_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    if not needs_grad:
        with torch.no_grad():
            nll = _chunked_nll(flat_h, weight, flat_y)
            keep, _ = _kept(flat_y, weights, nll.dtype)
            return (nll * keep).sum() / keep.sum()
    return _FusedLinearCrossEntropy.apply(flat_h, weight, flat_y, weights)


def perplexity_of(nll: float) -> float:
    """exp(mean NLL), clamped so an untrained or diverged model reports a huge finite number
    instead of overflowing (exp(700) ≈ 1e304)."""
    return math.exp(min(nll, 700.0))
