"""Causal multi-head self-attention with optional grouped-query heads and KV cache.

Attention receives the forward's ``PositionContext`` and uses it the same way whatever
the encoding: ``ctx.rotate`` on q and k, ``ctx.bias`` on the scores. Without a bias and
without a cache it is ``F.scaled_dot_product_attention`` with the fused ``is_causal``
path; a distance-only bias on CUDA goes to FlexAttention (model/flex_attention.py). With a bias or a cache, queries are processed in chunks with an explicit mask, so
a long sequence never materialises a full (H, T, T) bias; memory grows with chunk × T
instead of T². One new query against the cache (decoding) takes two small matmuls.
A contextual bias (CoPE) needs the logits themselves: each chunk then forms them in
float32, masked, hands them to ``ctx.contextual_bias`` and takes the softmax itself.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ropelab.model.config import ModelConfig
from ropelab.model.flex_attention import flex_causal_attention, usable_for_flex
from ropelab.model.kv_cache import KVCache
from ropelab.model.layers import QKVProjection
from ropelab.model.positional import PositionContext


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.wqkv = QKVProjection(cfg)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.cache: Optional[KVCache] = None  # attached by Transformer.setup_cache
        self.query_chunk = 512  # queries per chunk on the masked/biased path (512: fastest at 16×L)

    def forward(self, x: torch.Tensor, ctx: PositionContext) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.wqkv(x)  # (B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, D)
        q, k = ctx.rotate(q, k)
        k_positions = ctx.positions
        if self.cache is not None:
            k, v = self.cache.update(ctx.positions, k, v)  # (B, Hkv, Tk, D), Tk = last position + 1
            k_positions = torch.arange(k.shape[2], device=k.device)
        dropout = self.dropout if self.training else 0.0
        table = ctx.distance_table
        if self.cache is None and not ctx.has_bias:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, dropout_p=dropout)
        elif self.cache is None and table is not None and usable_for_flex(q, table, dropout):
            y = flex_causal_attention(q, k, v, ctx.positions, table)
        elif T == 1 and self.cache is not None and not ctx.contextual:
            y = self._decode_step(q, k, v, ctx.bias(ctx.positions, k_positions))
        else:
            y = self._chunked(q, k, v, ctx, k_positions, same_tokens=self.cache is None)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))  # (B, T, d)

    def _decode_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     bias: Optional[torch.Tensor]) -> torch.Tensor:
        """One new query against the cache: every cached key is visible, so no mask.

        Two small matmuls instead of the fused kernel, whose fixed cost per call (~3 ms on
        a 2-core CPU) was most of a decoding step. Query heads are grouped under their
        key/value head, so GQA needs no copies of k and v.
        """
        B, _, _, D = q.shape
        groups = self.n_heads // self.n_kv_heads
        qg = q.view(B, self.n_kv_heads, groups, D)  # (B, Hkv, G, D): the single position folded in
        scores = (qg @ k.transpose(-2, -1)).float() / math.sqrt(D)  # (B, Hkv, G, Tk)
        if bias is not None:  # (H, 1, Tk)
            scores = scores + bias.view(self.n_kv_heads, groups, -1)
        probs = F.dropout(scores.softmax(dim=-1), self.dropout, self.training).to(v.dtype)
        return (probs @ v).view(B, self.n_heads, 1, D)  # (B, H, 1, D)

    def _chunked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: PositionContext,
                 k_positions: torch.Tensor, same_tokens: bool) -> torch.Tensor:
        """Attention over query chunks with an explicit causal mask and the encoding's bias.

        ``same_tokens``: keys are the queries' own tokens (no cache), so with ascending
        positions a chunk ending at query index e sees only keys 0 … e-1; the keys after
        it are dropped instead of masked, which halves the work of a long biased
        sequence (an explicit mask gets none of ``is_causal``'s block skipping).
        """
        dropout = self.dropout if self.training else 0.0
        outputs = []
        for start in range(0, q.shape[2], self.query_chunk):
            qp = ctx.positions[..., start:start + self.query_chunk]  # (tq,), or (B, tq) per sequence
            qc = q[:, :, start:start + self.query_chunk]
            kc, vc, kp = k, v, k_positions
            if same_tokens:
                end = start + qc.shape[2]
                kc, vc, kp = k[:, :, :end], v[:, :, :end], k_positions[..., :end]
            mask = (kp[..., None, :] <= qp[..., :, None]).unsqueeze(-3)  # (…, 1, tq, Tk), True = may attend
            bias = ctx.bias(qp, kp)  # (…, H, tq, Tk) float32, or None
            if ctx.contextual:
                outputs.append(self._contextual_chunk(qc, kc, vc, mask, bias, ctx, dropout).to(q.dtype))
                continue
            if bias is not None:
                mask = bias.masked_fill(~mask, float("-inf"))
                # The bias stays float32 up to the scores: in bf16 a slope·distance of ~2
                # is rounded to 2^-7, a whole slope step of the slowest ALiBi head at L=512,
                # so under autocast the biased path computes in float32.
                qc, kc, vc = qc.float(), kc.float(), vc.float()
            # A 4-D mask: with a 2-D or 3-D one the CPU kernel silently falls back to the
            # unfused math path, which holds (B, H, tq, Tk) scores (2-3x slower at 16×L).
            mask = mask.view((1,) * (4 - mask.dim()) + tuple(mask.shape))
            y = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, enable_gqa=True, dropout_p=dropout)
            outputs.append(y.to(q.dtype))
        return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]

    def _contextual_chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                          bias: Optional[torch.Tensor], ctx: PositionContext, dropout: float) -> torch.Tensor:
        """softmax(q·kᵀ/√d + bias + contextual bias) v for one query chunk, all in float32.

        The contextual bias is a function of the masked logits (CoPE's gates), so the
        scores are formed here rather than inside a fused kernel.
        """
        with _full_precision(q):
            q, k, v = q.float(), k.float(), v.float()
            groups = self.n_heads // self.n_kv_heads
            if groups > 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            logits = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, tq, Tk)
            logits = logits.masked_fill(~mask, float("-inf"))
            scores = logits + ctx.contextual_bias(q, logits)
            if bias is not None:
                scores = scores + bias
            probs = F.dropout(scores.softmax(dim=-1), dropout, self.training)
            return probs @ v

    def new_cache(self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        return KVCache(batch_size, max_len, self.n_kv_heads, self.head_dim, dtype, device)

    def flops_per_token(self, seq_len: int) -> float:
        """Forward matmul FLOPs per token, projections excluded: QKᵀ and AV over ``seq_len`` keys
        without the causal halving (PaLM, Chowdhery et al. 2022, App. B; nanoGPT's MFU)."""
        return 4 * self.n_heads * self.head_dim * seq_len


def _full_precision(x: torch.Tensor):
    """A context where autocast is off on ``x``'s device (the contextual path is float32)."""
    return torch.autocast(x.device.type, enabled=False)
