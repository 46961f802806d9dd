"""FlexAttention on CUDA (PyTorch's ``flex_attention``): score biases, windows, sinks, decays.

The fused SDPA kernel takes no bias and no window, so such layers otherwise run query
chunks with an explicit (H, tq, Tk) mask, which forgoes block skipping and writes the bias
into memory. FlexAttention instead adds to the scores inside the kernel: ``score_mod``
looks up the per-forward table ``table[h, pos_q − pos_k]`` (ALiBi, T5, KERPLE, and FIRE
below its threshold; model/positional/base.py's DistanceBias) in float32 and adds a
layer's decay c_q − c_k (FoX), and a block mask skips the blocks above the diagonal and,
for a sliding-window layer, those wholly before its window, so a window's cost grows with
T × window. Attention sinks join the softmax afterwards, exactly: the kernel's output times
σ(lse − sink) (model/attention_scores.py's ``sink_share``).

Block masks depend only on the length, the window and the device when positions are those
of a sequence from 0 (training, evaluation): they are built once per such key, compiled on
CUDA, and reused; per-sequence positions (randomized positions) build theirs per call. The
kernel is compiled with automatic dynamic shapes, so the lengths and batch sizes of an
evaluation reuse one compiled kernel instead of recompiling per shape (tests/unit/test_flex_attention.py
counts the compilations).

Tables that need no gradient (ALiBi always; learned tables in evaluation) use it on any
torch. Training a learned table (T5, KERPLE, FIRE) needs the gradient into a tensor that
``score_mod`` captures, a newer FlexAttention feature: it is used from torch
``FLEX_TABLE_GRAD_TORCH`` on, the version where it was checked, and older versions keep the
SDPA path. On one H100 (torch 2.11, docs/results/gpu-h100/flex_table_grad.py) every
gradient matched the SDPA path's to 1e-5 relative in fp32, apart from FIRE's output bias:
it shifts all of a head's scores alike, so its true gradient is zero and both paths give
rounding noise. A training step's forward and backward ran 3.0–4.2× faster (B 4, T 512,
d 512, 8 heads, bf16).

On a CPU ``flex_attention`` runs eagerly, as a slow reference (no backward): the tests
compare it with the SDPA path there.

Block sizes: for 64-dim heads in bf16 on an H100/H200, inductor's default forward tiles
(128 × 128, 3 stages) needed 245,760 bytes of shared memory inside a whole-model
``torch.compile`` (torch 2.11), above the 232,448 the GPU has, and every ALiBi run of
configs/ablations/core-gpu-local.yaml stopped at its first step ("No valid triton configs").
Heads of up to 64 therefore ask for 64 × 64 tiles (``KERNEL_OPTIONS``), the generic default
that PyTorch's maintainers suggest for this error (pytorch/pytorch#133254, #139507); larger
heads keep inductor's choice, which already uses narrower tiles for them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch
from torch.nn.attention import flex_attention as _flex
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from ropelab.model.attention_scores import sink_share
from ropelab.model.positional import PositionContext

Tensor = torch.Tensor


# Automatic dynamic shapes: the first call compiles for its shape, a call of another length or
# batch size recompiles once with those sizes symbolic, and later shapes reuse that kernel.
# dynamic=False compiled every (length, batch size) of an evaluation anew and passed Dynamo's
# recompile limit (8) within one study, falling back to the slow eager path.
COMPILE_OPTIONS = {"dynamic": None}


@lru_cache(maxsize=1)
def _compiled():
    return torch.compile(flex_attention, **COMPILE_OPTIONS)


def _mask_mod(window: Optional[int], positions: Optional[Tensor] = None):
    """Causal (and within ``window``) by index, or by per-sequence ``positions`` (B, T)."""
    if positions is None:
        if window is None:
            return lambda b, h, q, k: q >= k
        return lambda b, h, q, k: (q >= k) & (q - k < window)

    def by_position(b, h, q, k):
        distance = positions[b, q] - positions[b, k]
        return (distance >= 0) & (distance < window)
    return by_position


@lru_cache(maxsize=64)
def cached_block_mask(length: int, window: Optional[int], device: str):
    """The block mask of a sequence of ``length`` from position 0 (or of ascending per-sequence
    positions without a window), built once per key (compiled on CUDA)."""
    return create_block_mask(_mask_mod(window), None, None, length, length, device=device,
                             _compile=device.startswith("cuda"))


def block_mask(ctx: PositionContext, length: int, device: torch.device):
    if ctx.window is None or ctx.positions.dim() == 1:
        return cached_block_mask(length, ctx.window, str(device))
    B = ctx.positions.shape[0]
    return create_block_mask(_mask_mod(ctx.window, ctx.positions), B, None, length, length, device=str(device))


def _score_mod(positions: Tensor, table: Optional[Tensor], decay: Optional[Tensor]):
    """score + table[h, pos_q − pos_k] (+ c_q − c_k), or None when neither is added."""
    if table is None and decay is None:
        return None
    per_sequence = positions.dim() == 2

    def score_mod(score, b, h, q_idx, k_idx):
        if table is not None:
            distance = (positions[b, q_idx] - positions[b, k_idx]) if per_sequence else (
                positions[q_idx] - positions[k_idx])
            score = score + table[h, torch.clamp(distance, min=0)]
        if decay is not None:
            score = score + decay[b, h, q_idx] - decay[b, h, k_idx]
        return score
    return score_mod


def flex_attention_layer(q: Tensor, k: Tensor, v: Tensor, ctx: PositionContext, decay: Optional[Tensor],
                         sinks: Optional[Tensor]) -> Tensor:
    """One layer's causal attention with its table bias, decay, window and sinks.

    q (B, H, T, D), k/v (B, Hkv, T, D) (GQA), decay (B, H, T) float32 or None, sinks (H,)
    or None. Returns (B, H, T, D).
    """
    kwargs = dict(score_mod=_score_mod(ctx.positions, ctx.distance_table, decay),
                  block_mask=block_mask(ctx, q.shape[2], q.device), enable_gqa=True)
    if sinks is not None:
        kwargs.update(_lse_request())
    if q.is_cuda:
        out = _compiled()(q, k, v, kernel_options=kernel_options(q.shape[-1]), **kwargs)
    else:
        out = flex_attention(q, k, v, **kwargs)
    if sinks is None:
        return out
    out, aux = out
    lse = aux.lse if hasattr(aux, "lse") else aux
    return out * sink_share(lse, sinks).to(out.dtype)


def _lse_request() -> dict:
    """Ask for the log-sum-exp of the scores: ``return_aux`` where this torch has it."""
    if hasattr(_flex, "AuxRequest"):
        return {"return_aux": _flex.AuxRequest(lse=True)}
    return {"return_lse": True}


# The compiled kernel refuses smaller heads ("embedding dimension … must be at least 16",
# PyTorch 2.11); such models take the SDPA path.
MIN_HEAD_DIM = 16
# Forward tiles for heads of up to SMALL_TILES_HEAD_DIM (see the module docstring).
SMALL_TILES_HEAD_DIM = 64
KERNEL_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 64}
FLEX_TABLE_GRAD_TORCH = (2, 11)


def kernel_options(head_dim: int) -> dict | None:
    """FlexAttention's ``kernel_options`` for this head size (None: inductor's defaults)."""
    return dict(KERNEL_OPTIONS) if head_dim <= SMALL_TILES_HEAD_DIM else None


def torch_version(text: str = torch.__version__) -> tuple[int, int]:
    major, minor = text.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def trains_tables(version: tuple[int, int] | None = None) -> bool:
    """Whether this torch's FlexAttention is used for tensors that need a gradient."""
    return (version or torch_version()) >= FLEX_TABLE_GRAD_TORCH


def usable_for_flex(q: Tensor, ctx: PositionContext, training_dropout: float) -> bool:
    """Whether the FlexAttention path serves this layer's call (see the module docstring):
    CUDA, heads of at least MIN_HEAD_DIM, no dropout, no contextual bias (it needs the
    logits), a bias that is a distance table if any, and gradients into captured tensors
    (a trained table, a decay in training) only where this torch supports them."""
    if not q.is_cuda or q.shape[-1] < MIN_HEAD_DIM or training_dropout != 0.0 or ctx.contextual:
        return False
    table = ctx.distance_table
    if ctx.bias_fn is not None and table is None:
        return False
    needs_grad = (table is not None and table.requires_grad) or (ctx.decays and torch.is_grad_enabled())
    return not needs_grad or trains_tables()
