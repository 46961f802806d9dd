"""A preallocated per-layer key/value cache written at positions the host already knows.

Buffers are (B, n_kv_heads, slots, head_dim), allocated once by ``Transformer.setup_cache``
and never grown; the training path has no cache at all. A full-attention layer has a slot
per position (``max_len``). A sliding-window layer (model/layer_config.py) keeps only its
window: ``window`` slots used as a ring (position p in slot p mod window), each slot's
position kept beside it, so its memory is O(window) however long the sequence grows. A
layer with a data-dependent decay (the Forgetting Transformer) also keeps, per slot and
head, the running sum of its log forget gates up to that position.

``update`` takes the first position of the new tokens as a host integer (the caller, which
chose the positions, knows it): no layer reads a position back from the device.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ropelab.common.errors import LengthError

# The position of a ring slot not written yet: far below any query's window, so masked.
EMPTY = -(1 << 40)


class KVCache(nn.Module):
    def __init__(self, batch_size: int, max_len: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None = None, *,
                 window: Optional[int] = None, decay_heads: Optional[int] = None):
        super().__init__()
        self.max_len = max_len
        self.ring = window is not None and window < max_len
        self.slots = window if self.ring else max_len
        shape = (batch_size, n_kv_heads, self.slots, head_dim)
        # Not persistent: a cache is runtime state and never belongs in a checkpoint.
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        if self.ring:
            self.register_buffer("key_positions", torch.full((self.slots,), EMPTY, dtype=torch.long, device=device),
                                 persistent=False)
        # Running sums of log forget gates (FoX), float32 whatever the model dtype.
        decay_shape = None if decay_heads is None else (batch_size, decay_heads)
        self.register_buffer("decay", None if decay_shape is None else torch.zeros(*decay_shape, self.slots, device=device),
                             persistent=False)
        self.register_buffer("decay_end", None if decay_shape is None else torch.zeros(*decay_shape, device=device),
                             persistent=False)
        self.end = 0  # positions 0 … end-1 are written

    def _check(self, start: int, k: torch.Tensor) -> int:
        end = start + k.shape[2]
        if end > self.max_len:
            raise LengthError(f"KV cache holds {self.max_len} positions but position {end - 1} "
                              "was requested; set up the cache with a larger max_len")
        if k.shape[0] != self.k.shape[0]:
            raise ValueError(f"batch of {k.shape[0]} does not match the cache's {self.k.shape[0]}")
        if start != self.end and not (start < self.end and not self.ring):
            raise ValueError(f"the cache holds positions 0 … {self.end - 1}; the next tokens must start at "
                             f"{self.end}, not {start}")
        return end

    def running_decay(self, start: int, log_forget: torch.Tensor) -> torch.Tensor:
        """Cumulative log forget gates (B, H, T) of new tokens from ``start``, continuing the cached sum."""
        before = self.decay_end if start > 0 else torch.zeros_like(self.decay_end)
        if start > 0 and start < self.end:  # re-scored prefix of a full cache (not a ring)
            before = self.decay[:, :, start - 1]
        return before[..., None] + log_forget.cumsum(-1)

    def update(self, start: int, k: torch.Tensor, v: torch.Tensor, decay: Optional[torch.Tensor] = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Store k, v (B, Hkv, T, D) (and running decay sums (B, H, T)) at positions start …
        start+T−1 and return what the new queries attend over: keys, values, their positions
        (Tk,) and decay sums (B, H, Tk) or None.

        A full cache returns positions 0 … start+T−1 in order. A ring returns the slots it
        held before these tokens followed by the tokens themselves (its window for every new
        query, in no particular order: masks and biases read the positions), except for one
        new token, which is written first and sees the ring (exactly its window).
        """
        end = self._check(start, k)
        T = k.shape[2]
        if not self.ring:
            index = torch.arange(start, end, device=self.k.device)
            self.k.index_copy_(2, index, k.to(self.k.dtype))
            self.v.index_copy_(2, index, v.to(self.v.dtype))
            if decay is not None:
                self.decay.index_copy_(2, index, decay)
                self.decay_end.copy_(decay[..., -1])
            self.end = end
            positions = torch.arange(end, device=self.k.device)
            return self.k[:, :, :end], self.v[:, :, :end], positions, None if decay is None else self.decay[..., :end]
        if T == 1:
            self._write_ring(start, k, v, decay)
            return self.k, self.v, self.key_positions, self.decay
        keys = torch.cat((self.k, k.to(self.k.dtype)), dim=2)
        values = torch.cat((self.v, v.to(self.v.dtype)), dim=2)
        positions = torch.cat((self.key_positions, torch.arange(start, end, device=self.k.device)))
        decays = None if decay is None else torch.cat((self.decay, decay), dim=2)
        self._write_ring(start, k, v, decay)
        return keys, values, positions, decays

    def _write_ring(self, start: int, k: torch.Tensor, v: torch.Tensor, decay: Optional[torch.Tensor]) -> None:
        """Keep the newest ``slots`` of the new tokens, each in slot position mod slots."""
        end, keep = start + k.shape[2], min(k.shape[2], self.slots)
        new = torch.arange(end - keep, end, device=self.k.device)
        slots = new % self.slots
        self.k.index_copy_(2, slots, k[:, :, -keep:].to(self.k.dtype))
        self.v.index_copy_(2, slots, v[:, :, -keep:].to(self.v.dtype))
        self.key_positions.index_copy_(0, slots, new)
        if decay is not None:
            self.decay.index_copy_(2, slots, decay[..., -keep:])
            self.decay_end.copy_(decay[..., -1])
        self.end = end

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())
