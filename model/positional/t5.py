"""T5's relative position bias (Raffel et al. 2020, JMLR, §2.1), decoder (causal) form.

Each head learns one scalar per bucket of the distance n = i − j ≥ 0, added to the
attention logits. With B buckets (T5: 32) and a maximum distance D (T5: 128): the first
B/2 buckets are the exact distances 0 … B/2−1; the others cover B/2 … D log-spaced,

    bucket(n) = B/2 + floor( ln(n / (B/2)) / ln(D / (B/2)) · (B − B/2) ),  capped at B − 1,

so every distance from D on shares the last bucket. A decoder sees only the past, so all
B buckets go to one direction (T5's unidirectional rule; the encoder splits them between
past and future). As in T5 the table is shared by all layers: one encoding per model.
Initialisation: N(0, d_model^−1/2), transformers' T5 ``_init_weights``.

The bucket of each distance is fixed, so a bucket index is cached for distances
0 … n−1 (grown in powers of two); a forward looks the learned table up once for the
distances it can meet (model/positional/distance.py) and every layer gathers from that.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from ropelab.model.config import ModelConfig
from ropelab.model.positional.distance import TableBias


def t5_bucket(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's causal bucket of each distance i − j (negative distances count as 0), int64."""
    exact = num_buckets // 2
    n = distance.clamp(min=0).to(torch.int64)
    # float64 so a distance on a bucket boundary lands in the formula's bucket exactly.
    log_ratio = torch.log(n.clamp(min=1).to(torch.float64) / exact) / math.log(max_distance / exact)
    spread = exact + (log_ratio * (num_buckets - exact)).to(torch.int64)
    return torch.where(n < exact, n, spread.clamp(max=num_buckets - 1))


class T5Bias(TableBias):
    """A learned bias per head and log-spaced distance bucket, shared by every layer."""

    kind = "t5"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_buckets, self.max_distance = cfg.pos.t5.num_buckets, cfg.pos.t5.max_distance
        self.init_std = cfg.d_model ** -0.5
        self.weight = nn.Parameter(torch.empty(cfg.n_heads, self.num_buckets))  # (H, buckets)
        self._buckets: Optional[torch.Tensor] = None  # bucket of distances 0 … rows−1
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.init_std)

    def buckets(self, n: int, device: torch.device) -> torch.Tensor:
        """Bucket indices of distances 0 … n−1, from a cache grown in powers of two."""
        cached = self._buckets
        if cached is None or cached.device != device or cached.shape[0] < n:
            rows = max(256, 1 << (n - 1).bit_length())
            # Outside inference mode: the cache indexes the table in later training steps.
            with torch.inference_mode(False):
                cached = t5_bucket(torch.arange(rows, device=device), self.num_buckets, self.max_distance)
            self._buckets = cached
        return cached[:n]

    def distance_table(self, n: int, device: torch.device) -> torch.Tensor:
        return self.weight.float()[:, self.buckets(n, device)]  # (H, n)
