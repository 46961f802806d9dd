"""The pieces of a LLaMA block: RMSNorm, the SwiGLU MLP, and the fused q/k/v projection.

Two projections are fused so a step runs fewer, larger matmuls (at small shapes the per-op
overhead dominates): q, k and v come from one weight, and SwiGLU's gate and up from one.
The math is unchanged: the fused weight is the separate weights stacked by rows.
Checkpoints with the separate weights, and Hugging Face Llama weights, are converted with
``fuse_projections`` / ``split_projections``.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from ropelab.model.config import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), no bias, statistics in float32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x·rsqrt(mean(x²) + eps) in float32, as one fused operator: the same values and
        # gradients as writing it out (tests/unit/test_model.py), ~4× faster on CPU than the five
        # elementwise operators and their saved intermediates.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return normed.to(x.dtype) * self.weight


class SwiGLU(nn.Module):
    """w2(silu(gate x) ⊙ up x) (Shazeer 2020), as in LLaMA; gate and up are the two halves
    of ``w13`` (LLaMA's w1 and w3); no biases."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w13 = nn.Linear(cfg.d_model, 2 * cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class QKVProjection(nn.Linear):
    """q, k and v from one matmul, GQA-aware: weight rows [q: H·D | k: Hkv·D | v: Hkv·D]."""

    def __init__(self, cfg: ModelConfig):
        self.heads = (cfg.n_heads, cfg.kv_heads, cfg.kv_heads)
        self.head_dim = cfg.head_dim
        super().__init__(cfg.d_model, (cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q (B, H, T, D), k (B, Hkv, T, D), v (B, Hkv, T, D)) for x (B, T, d_model)."""
        parts = super().forward(x).split([h * self.head_dim for h in self.heads], dim=-1)
        return tuple(p.unflatten(-1, (h, self.head_dim)).transpose(1, 2)  # (B, h, T, D)
                     for p, h in zip(parts, self.heads))

    def parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of the q, k and v rows of the weight (writing to them writes the weight)."""
        return tuple(self.weight.split([h * self.head_dim for h in self.heads], dim=0))


# --- separate <-> fused weights ---------------------------------------------------------------
# Names of the separate projections, as older checkpoints and the Llama mapping have them.
_SEPARATE = {"attn.wqkv": ("attn.wq", "attn.wk", "attn.wv"), "mlp.w13": ("mlp.w1", "mlp.w3")}


def fuse_projections(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict with separate q/k/v and gate/up weights (``blocks.i.attn.wq.weight`` …)
    converted to the fused layout; a state dict already fused is returned unchanged."""
    out = dict(state)
    for key in list(state):
        match = re.fullmatch(r"(blocks\.\d+\.)(attn\.wq|mlp\.w1)\.weight", key)
        if not match:
            continue
        fused = next(f for f, names in _SEPARATE.items() if names[0] == match.group(2))
        names = [f"{match.group(1)}{n}.weight" for n in _SEPARATE[fused]]
        out[f"{match.group(1)}{fused}.weight"] = torch.cat([out.pop(n) for n in names], dim=0)
    return out


def fused_parts(name: str) -> list[str]:
    """The separate parameter names a fused one stands for (itself for any other name)."""
    match = re.fullmatch(r"(blocks\.\d+\.)(attn\.wqkv|mlp\.w13)\.weight", name)
    if not match:
        return [name]
    return [f"{match.group(1)}{part}.weight" for part in _SEPARATE[match.group(2)]]


def split_projections(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The inverse of ``fuse_projections``: fused weights split into the separate ones."""
    sizes = {"attn.wqkv": [h * cfg.head_dim for h in (cfg.n_heads, cfg.kv_heads, cfg.kv_heads)],
             "mlp.w13": [cfg.hidden_dim, cfg.hidden_dim]}
    out = {}
    for key, value in state.items():
        match = re.fullmatch(r"(blocks\.\d+\.)(attn\.wqkv|mlp\.w13)\.weight", key)
        if not match:
            out[key] = value
            continue
        for name, part in zip(_SEPARATE[match.group(2)], value.split(sizes[match.group(2)], dim=0)):
            out[f"{match.group(1)}{name}.weight"] = part
    return out
