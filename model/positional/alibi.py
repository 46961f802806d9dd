"""ALiBi: attention with linear biases (Press, Smith & Lewis, ICLR 2022).

No position embedding; head h adds −slope_h · (i − j) to the score of query i and key j.
"""

from __future__ import annotations

import math

import torch

from ropelab.model.config import ModelConfig
from ropelab.model.positional.distance import TableBias


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al. (2022) head slopes.

    For n a power of two: the geometric sequence starting at 2^(-8/n) with that ratio.
    Otherwise (the paper's rule, §3 and its reference code): the slopes of the closest
    smaller power of two m, followed by every other slope of 2m, up to n in total.
    """
    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if n_heads & (n_heads - 1) == 0:
        slopes = power_of_two(n_heads)
    else:
        m = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(m) + power_of_two(2 * m)[0::2][: n_heads - m]
    return torch.tensor(slopes, dtype=torch.float32)


class ALiBi(TableBias):
    """Linear attention biases: head h adds -slope_h · (i - j) to the score of query i, key j.

    A distance-only bias, served like the learned ones from one (H, fit_len) table per
    forward (model/positional/distance.py): the same float32 products, computed once.
    """

    kind = "alibi"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # A plain float32 attribute, not a buffer, so a bf16 cast of the model keeps the
        # slopes exact; moved to the positions' device when used.
        self.slopes = alibi_slopes(cfg.n_heads)

    def distance_table(self, n: int, device: torch.device) -> torch.Tensor:
        distance = torch.arange(n, device=device, dtype=torch.float32)
        return -self.slopes.to(device)[:, None] * distance[None, :]  # (H, n), float32
