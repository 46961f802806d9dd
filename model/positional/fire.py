"""FIRE: functional interpolation for relative positions (Li et al. 2023, ICLR 2024,
"Functional Interpolation for Relative Positions Improves Long Context Transformers").

Head h adds f_θ(ψ(i − j) / ψ(max(L, i)))_h to the score of query i and key j, where
ψ(x) = ln(c·x + 1) amplifies differences between nearby positions, the normaliser
ψ(max(L, i)) maps every distance a query can see into [0, 1] ("progressive
interpolation": a query beyond the threshold L sees its whole context squeezed into the
range it saw in training), and f_θ is an MLP 1 → width → ReLU → H. Learned: the MLP, c
and L. Defaults are the paper's implementation: width 32, c = 0.1, L = 512 (learned as a
multiplier of 512, starting at 1), ε = 1e-6 added to the normaliser, PyTorch's default
Linear initialisation; |c| and |L| are used, as there.

One FIRE is shared by all layers here, as the positional interface shares one encoding per
model (as T5 shares its bias); a FIRE per layer would cost n_layers times the parameters
and the MLP work.

Cost: while no query is beyond L (every training step when train.seq_len ≤ L), the
normaliser is ψ(L) for all rows, so the bias depends on the distance only and the MLP runs
once per forward on the fit_len distances the forward can meet (model/positional/
distance.py). When some query lies beyond L the input depends on (i, j), and the MLP runs
per query chunk in each layer on that chunk's pairs, in blocks that bound its memory.
Deciding which case applies reads L on the host once per forward.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ropelab.model.config import ModelConfig
from ropelab.model.positional.base import Bias, DistanceBias, causal_distance
from ropelab.model.positional.distance import TableBias

EPS = 1e-6  # added to the normaliser, as in the paper's implementation
BLOCK_PAIRS = 1 << 16  # (query, key) pairs per MLP call on the pairwise path


def psi(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """ψ(x) = ln(|c|·x + 1)."""
    return torch.log1p(c.abs() * x)


class Fire(TableBias):
    """f_θ(ψ(i−j) / ψ(max(L, i))) per head, with θ, c and L learned."""

    kind = "fire"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        fire = cfg.pos.fire
        self.mlp = nn.Sequential(nn.Linear(1, fire.mlp_width), nn.ReLU(), nn.Linear(fire.mlp_width, cfg.n_heads))
        self.init_c, self.init_threshold = fire.init_c, fire.threshold
        self.c = nn.Parameter(torch.tensor(fire.init_c))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))  # L = |scale| · initial L
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()  # PyTorch's default, as the paper's implementation
        with torch.no_grad():
            self.c.fill_(self.init_c)
            self.threshold_scale.fill_(1.0)

    def threshold(self) -> torch.Tensor:
        return (self.threshold_scale.float() * self.init_threshold).abs()

    def f(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP on inputs x (…), float32 even under autocast: (…, H)."""
        with torch.autocast(x.device.type, enabled=False):
            return self.mlp(x.float()[..., None])

    def prepare_bias(self, fit_len: int, device: torch.device) -> Optional[Bias]:
        if fit_len - 1 > float(self.threshold().detach()):
            return self.pairwise_bias  # some query may lie beyond L: the input depends on (i, j)
        return DistanceBias(self.distance_table(fit_len, device))

    def distance_table(self, n: int, device: torch.device) -> torch.Tensor:
        """The bias at distances 0 … n−1 for queries at or below L (normaliser ψ(L))."""
        c = self.c.float()
        distance = torch.arange(n, device=device, dtype=torch.float32)
        x = psi(distance, c) / (psi(self.threshold(), c) + EPS)
        return self.f(x).t().contiguous()  # (H, n)

    def pairwise_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The bias for every (query, key) pair, (…, H, Tq, Tk); exact for any positions."""
        c = self.c.float()
        distance = causal_distance(q_positions, k_positions).float()  # (…, Tq, Tk)
        normaliser = psi(torch.maximum(q_positions.float(), self.threshold()), c) + EPS  # (…, Tq)
        x = psi(distance, c) / normaliser[..., None]
        rows = max(1, BLOCK_PAIRS // max(1, x.shape[-1]))
        blocks = [self.f(x[..., start:start + rows, :]) for start in range(0, x.shape[-2], rows)]
        out = torch.cat(blocks, dim=-3) if len(blocks) > 1 else blocks[0]  # (…, Tq, Tk, H)
        return out.movedim(-1, -3).contiguous()
