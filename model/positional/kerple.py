"""KERPLE, logarithmic variant (Chi et al. 2022, NeurIPS, "KERPLE: Kernelized Relative
Positional Embedding for Length Extrapolation").

Head h adds −r₁·ln(1 + r₂·(i − j)) to the score of query i and key j, with learned
r₁, r₂ > 0 per head: a conditionally positive definite kernel turned into a bias, which
decays logarithmically with distance where ALiBi decays linearly.

Parameterisation, as in the public implementation (NVIDIA NeMo's port of the authors'
code): r₁ starts uniform in (0, 2), r₂ uniform in (0, 1), and both are kept ≥ 0.01. In training the stored values are
projected onto that bound before each forward (projected gradient descent, so a parameter
pushed to the bound can still move back); the forward itself always reads them clamped.

The bias depends on the distance only: one (H, fit_len) table per forward, gathered by
every layer (model/positional/distance.py).
"""

from __future__ import annotations

import torch
from torch import nn

from ropelab.model.config import ModelConfig
from ropelab.model.positional.distance import TableBias

MIN_PARAM = 1e-2  # the lower bound on r₁ and r₂


class Kerple(TableBias):
    """−r₁·ln(1 + r₂·distance) per head, r₁ and r₂ learned."""

    kind = "kerple"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.r1 = nn.Parameter(torch.empty(cfg.n_heads))
        self.r2 = nn.Parameter(torch.empty(cfg.n_heads))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.r1.uniform_(0.0, 2.0)
            self.r2.uniform_(0.0, 1.0)

    def _positive(self, param: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            with torch.no_grad():
                param.clamp_(min=MIN_PARAM)
        return param.float().clamp(min=MIN_PARAM)

    def distance_table(self, n: int, device: torch.device) -> torch.Tensor:
        r1, r2 = self._positive(self.r1), self._positive(self.r2)
        distance = torch.arange(n, device=device, dtype=torch.float32)
        return -r1[:, None] * torch.log1p(r2[:, None] * distance[None, :])  # (H, n)
