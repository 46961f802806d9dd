"""CoPE, contextual position encoding (Golovneva et al. 2024, "Contextual Position Encoding:
Learning to Count What's Important", arXiv:2405.18719).

A position that counts what the model chooses to count. For query i and key j ≤ i, each
key t between them is counted by a gate g_it = σ(q_i·k_t/√d), and the contextual position
of j is

    p_ij = Σ_{t=j}^{i} g_it,     capped at p_max − 1 (``pos.cope.max_pos`` = p_max).

p is fractional, so the position embedding is interpolated between its integer neighbours,
e[p] = (p − ⌊p⌋)·e[⌈p⌉] + (1 − p + ⌊p⌋)·e[⌊p⌋], and the score gains q_i·e[p_ij]:

    a_ij = softmax_j(q_i·k_j/√d + q_i·e[p_ij]).

q_i·e[p] is linear in e, so it is computed as the paper suggests: z_i[n] = q_i·e[n] for the
p_max integers n (one (Tq, D) × (D, p_max) matmul), then interpolated per (i, j), instead
of materialising e[p_ij] for every pair. As in the paper, each layer has its own embeddings
(p_max × head_dim), shared by the heads, and the gates of each head use that head's own
logits; the embeddings start at zero (``pos.cope.init_std``: 0), so training starts as NoPE.

CoPE takes no position indices: the count is the position. Keys after the query have
gate 0 (their logits are −inf), so a count never looks ahead, and with a KV cache the
count of a new query is formed over its cached keys exactly as in the full forward.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ropelab.model.config import ModelConfig
from ropelab.model.positional.base import PositionalEncoding

Tensor = torch.Tensor


class CoPE(PositionalEncoding):
    """Contextual positions from gated counts; one embedding table per layer (see module doc)."""

    kind = "cope"
    contextual = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.max_pos, self.init_std = cfg.pos.cope.max_pos, cfg.pos.cope.init_std
        self.weight = nn.Parameter(torch.empty(cfg.n_layers, self.max_pos, cfg.head_dim))  # (layers, p_max, D)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.init_std > 0:
            nn.init.normal_(self.weight, mean=0.0, std=self.init_std)
        else:
            nn.init.zeros_(self.weight)

    def positions(self, logits: Tensor) -> Tensor:
        """The capped contextual position p_ij of every key for every query, float32.

        ``logits`` (…, Tq, Tk) are the scaled scores with −inf where a key is masked, so
        masked keys have gate 0 and a count sums only the keys from j to the query.
        """
        gates = torch.sigmoid(logits.float())
        counts = gates.flip(-1).cumsum(-1).flip(-1)  # Σ over t ≥ j of g_it
        return counts.clamp(max=self.max_pos - 1)

    def contextual_bias(self, layer: int, q: Tensor, logits: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """q_i·e[p_ij] for q (B, H, Tq, D) and logits (B, H, Tq, Tk): (B, H, Tq, Tk) float32."""
        p = self.positions(logits)
        z = q.float() @ self.weight[layer].float().transpose(0, 1)  # (B, H, Tq, p_max): q·e[n]
        below = p.floor()
        z_below = z.gather(-1, below.long())
        z_above = z.gather(-1, p.ceil().long())
        return torch.lerp(z_below, z_above, p - below)
