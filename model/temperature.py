"""A layer's attention temperature: a factor on its queries that grows with the length.

- Scalable-Softmax (Nakanishi 2025, arXiv:2501.19399): softmax(s·log n · z) over the n
  keys a query sees, written as q × s·log n (its §3: "a simple multiplication of the query
  vector"), s learned per head of the layer from ``ssmax_init``. n is the query's count of
  visible keys: position + 1 in a sequence from position 0 (a KV cache's prefill and decode
  alike), at most the window of a sliding-window layer; with per-sequence positions
  (randomized positions, no cache) each query sees its index + 1 keys.
- Llama 4's temperature tuning (transformers' Llama4TextAttention): q × (1 + β·log(1 +
  ⌊(p + 1)/c⌋)) at position p, with β = ``beta`` and c = ``floor_scale``; no parameters.

The factor is computed in float32 from the positions the layer's context carries, so a
cached decode and the full forward scale a query alike.
"""

from __future__ import annotations

import torch
from torch import nn

from ropelab.model.layer_config import TemperatureConfig
from ropelab.model.positional import PositionContext

Tensor = torch.Tensor


class Temperature(nn.Module):
    def __init__(self, cfg: TemperatureConfig, n_heads: int):
        super().__init__()
        self.kind, self.cfg = cfg.kind, cfg
        if self.kind == "ssmax":
            self.scale = nn.Parameter(torch.full((n_heads,), cfg.ssmax_init))

    def reset_parameters(self) -> None:
        if self.kind == "ssmax":
            nn.init.constant_(self.scale, self.cfg.ssmax_init)

    def factor(self, ctx: PositionContext) -> Tensor:
        """The factor on each head's query at each position: (H or 1, T) or (B, H or 1, T), float32."""
        positions = ctx.positions.float()
        if self.kind == "llama4":
            c = self.cfg.floor_scale
            return (1 + self.cfg.beta * torch.log1p(torch.floor((positions + 1) / c)))[..., None, :]
        if positions.dim() == 2:  # per-sequence positions: the keys are this forward's tokens
            positions = torch.arange(positions.shape[-1], device=positions.device, dtype=torch.float32)
        keys = positions + 1
        if ctx.window is not None:
            keys = keys.clamp(max=ctx.window)
        return self.scale.float()[:, None] * torch.log(keys)[..., None, :]  # (H, T)

    def forward(self, q: Tensor, ctx: PositionContext) -> Tensor:
        """q (B, H, T, D) scaled by the factor, in q's dtype."""
        return (q.float() * self.factor(ctx)[..., None]).to(q.dtype)
