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

from typing import Optional

import torch

from ropelab.model.positional.base import Bias, DistanceBias, PositionalEncoding

Tensor = torch.Tensor


class TableBias(PositionalEncoding):
    """Base of the distance-only bias encodings: subclasses give ``distance_table``."""

    has_bias = True

    def distance_table(self, n: int, device: torch.device) -> Tensor:
        """The bias of each head at distances 0 … n−1, float32, (H, n)."""
        raise NotImplementedError

    def prepare_bias(self, fit_len: int, device: torch.device) -> Optional[Bias]:
        return DistanceBias(self.distance_table(fit_len, device))

    def bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias between any positions (a convenience; forwards use ``prepare_bias``)."""
        fit_len = int(torch.cat((q_positions.flatten(), k_positions.flatten())).max()) + 1
        return self.prepare_bias(fit_len, q_positions.device)(q_positions, k_positions)
