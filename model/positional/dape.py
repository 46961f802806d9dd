"""DAPE, data-adaptive positional encoding (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive
Positional Encoding for Length Extrapolation", arXiv:2405.14722).

A score bias that depends on the content as well as the distance: for query i and key j,

    score_ij = A_ij + B_ij + f(A_ij, B_ij),

A the scaled logits q_i·k_j/√d of every head, B the bias of a base encoding (KERPLE, the
paper's headline variant, or another distance-table bias: ALiBi, T5's, FIRE; ``pos.dape.base``), and f a small MLP applied to
each (i, j) pair on the heads' values side by side: Linear(2H → ``pos.dape.mlp_width``,
32 in the paper) → LeakyReLU → Linear(→ H), as the authors' code computes it. Each layer
has its own MLP. f acts on one pair at a time, so it never mixes keys: causality is the
mask's, and a masked pair (its logit −inf) enters f as 0 and stays masked.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ropelab.model.config import ModelConfig
from ropelab.model.positional.alibi import ALiBi
from ropelab.model.positional.base import Bias, PositionalEncoding
from ropelab.model.positional.fire import Fire
from ropelab.model.positional.kerple import Kerple
from ropelab.model.positional.t5 import T5Bias

Tensor = torch.Tensor
BASES = {cls.kind: cls for cls in (ALiBi, T5Bias, Kerple, Fire)}  # model/encodings.py: DAPE_BASES


class DAPE(PositionalEncoding):
    """A base bias encoding (``base``) and a per-layer MLP over (logits, bias) of each pair."""

    kind = "dape"
    has_bias = True
    contextual = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        width, heads = cfg.pos.dape.mlp_width, cfg.n_heads
        self.base = BASES[cfg.pos.dape.base](cfg)
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(2 * heads, width), nn.LeakyReLU(),
                                                nn.Linear(width, heads)) for _ in range(cfg.n_layers))

    def reset_parameters(self) -> None:
        self.base.reset_parameters()  # the MLPs keep the model's N(0, init_std) with zero biases
        for mlp in self.mlps:
            for module in mlp:
                if isinstance(module, nn.Linear):
                    nn.init.zeros_(module.bias)

    def prepare_bias(self, fit_len: int, device: torch.device) -> Optional[Bias]:
        return self.base.prepare_bias(fit_len, device)

    def bias(self, q_positions: Tensor, k_positions: Tensor) -> Optional[Tensor]:
        return self.base.bias(q_positions, k_positions)

    def contextual_bias(self, layer: int, q: Tensor, logits: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """f(A, B) (B, H, Tq, Tk) float32 for masked logits A (B, H, Tq, Tk) and the base's bias B.

        f is computed only on the pairs a query may see. A square block (Tq = Tk) is a query
        chunk over its own tokens (attention's callers, model/attention.py: a forward without a
        cache, a prefill into an empty cache, the diagnostics' probe), whose keys after the
        query are masked: f goes to the lower triangle alone, half the pairs, and the masked
        pairs above it get 0 (their score is −inf whatever is added). Otherwise every pair.
        """
        *lead, heads, tq, tk = logits.shape
        mlp = self.mlps[layer]
        w1, b1, w2, b2 = (p.float() for p in (mlp[0].weight, mlp[0].bias, mlp[2].weight, mlp[2].bias))
        a = logits.float().masked_fill(torch.isinf(logits), 0.0)
        if bias is None:  # B = 0: only the logits' half of the first Linear acts
            x, w1 = a, w1[:, :heads]
        else:
            x = torch.cat((a, bias.float().expand_as(a)), dim=-3)  # (…, 2H, Tq, Tk)
        pairs = _lower_triangle(tq, logits.device) if tq == tk else None  # flat indices into Tq·Tk
        x = x.flatten(-2) if pairs is None else x.flatten(-2).index_select(-1, pairs)  # (…, 2H, N)
        # Pairs along rows, heads along columns: each Linear is one matrix product over all pairs.
        hidden = F.leaky_relu(F.linear(x.transpose(-1, -2), w1, b1))  # (…, N, width)
        out = F.linear(hidden, w2, b2).transpose(-1, -2)  # (…, H, N)
        if pairs is None:
            return out.unflatten(-1, (tq, tk))
        return out.new_zeros(*out.shape[:-1], tq * tk).index_copy(-1, pairs, out).unflatten(-1, (tq, tk))


def _lower_triangle(t: int, device: torch.device) -> Tensor:
    """The flat indices i·t + j of the pairs j ≤ i of a t × t block."""
    rows, cols = torch.tril_indices(t, t, device=device)
    return rows * t + cols
