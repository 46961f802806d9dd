"""FlexAttention for distance-only score biases on CUDA (PyTorch's ``flex_attention``).

The fused SDPA kernel takes no bias, so biased encodings otherwise run query chunks with
an explicit (H, tq, Tk) mask, which forgoes the causal block skipping and writes the
bias into memory. FlexAttention instead adds the bias inside the kernel: ``score_mod``
looks up the per-forward table ``table[h, pos_q − pos_k]`` (ALiBi, T5, KERPLE, and FIRE
below its threshold; model/positional/base.py's DistanceBias) in float32, and a causal
block mask skips the blocks above the diagonal.

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

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

Tensor = torch.Tensor


@lru_cache(maxsize=1)
def _compiled():
    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=32)
def _causal_block_mask(length: int, device: str):
    return create_block_mask(lambda b, h, q, k: q >= k, None, None, length, length, device=device)


def flex_causal_attention(q: Tensor, k: Tensor, v: Tensor, positions: Tensor, table: Tensor) -> Tensor:
    """Causal attention with ``table[h, pos_q − pos_k]`` added to the scores.

    q (B, H, T, D), k/v (B, Hkv, T, D) (GQA), positions (T,) or (B, T) ascending,
    table (H, n) float32 with n above every distance. Returns (B, H, T, D).
    """
    if positions.dim() == 1:
        def score_mod(score, b, h, q_idx, k_idx):
            return score + table[h, torch.clamp(positions[q_idx] - positions[k_idx], min=0)]
    else:
        def score_mod(score, b, h, q_idx, k_idx):
            return score + table[h, torch.clamp(positions[b, q_idx] - positions[b, k_idx], min=0)]
    mask = _causal_block_mask(q.shape[2], str(q.device))
    if not q.is_cuda:
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=True)
    return _compiled()(q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=True,
                       kernel_options=kernel_options(q.shape[-1]))


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
    """Whether this torch's FlexAttention is used for tables that need a gradient."""
    return (version or torch_version()) >= FLEX_TABLE_GRAD_TORCH


def usable_for_flex(q: Tensor, table: Tensor, training_dropout: float) -> bool:
    """Whether the FlexAttention path serves this call (see the module docstring)."""
    return (q.is_cuda and q.shape[-1] >= MIN_HEAD_DIM and (not table.requires_grad or trains_tables())
            and training_dropout == 0.0)
