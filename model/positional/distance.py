"""Score biases that depend on the causal distance i − j only, served from one table per forward.

T5, Kerple and (below its threshold) FIRE give each head a bias that is a function of the
distance alone. Computing that function for every (query, key) pair in every layer would
repeat the same work n_layers times over T² pairs; instead ``TableBias.prepare_bias``
evaluates it once per forward for the distances 0 … fit_len−1 the forward can meet (an
(H, fit_len) float32 table, part of the autograd graph), and each layer's query chunk
gathers its (H, Tq, Tk) slice from it. The gather's backward sums every use into the table,
so the learned parameters receive the gradient of all layers through one small tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from model.positional.base import Bias, PositionalEncoding

Tensor = torch.Tensor


def causal_distance(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """i − j for every query i and key j, clamped at 0: (Tq, Tk), or (B, Tq, Tk) per sequence.

    Keys after the query (negative distances) are masked by attention anyway; clamping
    keeps them valid table indices.
    """
    return (q_positions[..., :, None] - k_positions[..., None, :]).clamp(min=0)


@dataclass(frozen=True)
class DistanceBias:
    """A per-forward bias function: ``table[h, i − j]`` for any query and key positions."""

    table: Tensor  # (H, fit_len) float32: the bias at causal distance 0 … fit_len−1

    def __call__(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        distance = causal_distance(q_positions, k_positions)
        if distance.dim() == 2:
            return self.table[:, distance]  # (H, Tq, Tk); one index tensor: the fastest gather
        heads = torch.arange(self.table.shape[0], device=distance.device).view(-1, 1, 1)
        return self.table[heads, distance.unsqueeze(-3)]  # (B, H, Tq, Tk)


class TableBias(PositionalEncoding):
    """Base of the distance-only bias encodings: subclasses give ``distance_table``."""

    has_bias = True

    def distance_table(self, n: int, device: torch.device) -> Tensor:
        """The bias of each head at distances 0 … n−1, float32, (H, n)."""
        raise NotImplementedError

    def prepare_bias(self, fit_len: int) -> Optional[Bias]:
        return DistanceBias(self.distance_table(fit_len, self.device))

    def bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias between any positions (a convenience; forwards use ``prepare_bias``)."""
        fit_len = int(torch.cat((q_positions.flatten(), k_positions.flatten())).max()) + 1
        return self.prepare_bias(fit_len)(q_positions, k_positions)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device
