"""The recurrent state of one linear-attention layer: the KV cache's O(1) counterpart.

Causal linear attention needs from the past only two running sums per key/value head
(model/linear_attention.py): S = Σ_j R_j φ(k_j) v_jᵀ (D × D) for the numerator and
z = Σ_j φ(k_j) (D) for the denominator. Their size does not depend on how many tokens
were summed, so decoding costs the same at every position. Attached by
``Transformer.setup_cache``; absent on the training path.

The sums are float32 whatever the model dtype: a bf16 running sum stops absorbing small
increments after a few hundred tokens (8 bits of mantissa).
"""

from __future__ import annotations

import torch
from torch import nn

from ropelab.common.errors import LengthError


class LinearState(nn.Module):
    def __init__(self, batch_size: int, max_len: int, n_kv_heads: int, head_dim: int,
                 device: torch.device | str | None = None):
        super().__init__()
        # max_len is the planned sequence length (prompt + new tokens): the state itself
        # is unbounded, but dynamic NTK fits its frequencies to it, as with a KV cache.
        self.max_len = max_len
        self.length = 0  # positions 0 … length-1 are summed into the state
        # Not persistent: runtime state, never part of a checkpoint.
        self.register_buffer("kv", torch.zeros(batch_size, n_kv_heads, head_dim, head_dim,
                                               dtype=torch.float32, device=device), persistent=False)
        self.register_buffer("k_sum", torch.zeros(batch_size, n_kv_heads, head_dim,
                                                  dtype=torch.float32, device=device), persistent=False)

    def check(self, positions: torch.Tensor, batch_size: int) -> None:
        """Raise unless ``positions`` are the next ones in order (a sum cannot be rewritten)."""
        first, last = positions[[0, -1]].tolist()
        if last + 1 > self.max_len:
            raise LengthError(f"the attention state was set up for {self.max_len} positions but "
                              f"position {last} was requested; set up the cache with a larger max_len")
        if first != self.length or last - first + 1 != len(positions):
            raise ValueError(f"the linear-attention state holds positions 0 … {self.length - 1} and "
                             f"can only continue at {self.length}, in order (got {first} … {last}); "
                             "clear and set up the cache to start again")
        if batch_size != self.kv.shape[0]:
            raise ValueError(f"batch of {batch_size} does not match the state's {self.kv.shape[0]}")

    def update(self, kv: torch.Tensor, k_sum: torch.Tensor, n_tokens: int) -> None:
        """Store the sums after ``n_tokens`` more positions."""
        self.kv.copy_(kv)
        self.k_sum.copy_(k_sum)
        self.length += n_tokens
