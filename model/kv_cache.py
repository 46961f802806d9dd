"""A preallocated per-layer key/value cache written at explicit positions.

Buffers are (B, n_kv_heads, max_len, head_dim), allocated once by
``Transformer.setup_cache`` and never grown; the training path has no cache at all.
"""

from __future__ import annotations

import torch
from torch import nn

from ropelab.common.errors import LengthError


class KVCache(nn.Module):
    def __init__(self, batch_size: int, max_len: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None = None):
        super().__init__()
        self.max_len = max_len
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        # Not persistent: a cache is runtime state and never belongs in a checkpoint.
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, Hkv, T, D) at ``positions`` and return keys/values 0 … last position.

        Positions must be ascending and everything before them already written (prefill
        then decode), which is what makes the returned prefix valid.
        """
        end = int(positions[-1]) + 1
        if end > self.max_len:
            raise LengthError(f"KV cache holds {self.max_len} positions but position {end - 1} "
                              "was requested; set up the cache with a larger max_len")
        if k.shape[0] != self.k.shape[0]:
            raise ValueError(f"batch of {k.shape[0]} does not match the cache's {self.k.shape[0]}")
        self.k.index_copy_(2, positions, k.to(self.k.dtype))
        self.v.index_copy_(2, positions, v.to(self.v.dtype))
        return self.k[:, :, :end], self.v[:, :, :end]
