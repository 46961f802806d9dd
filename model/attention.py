"""Causal multi-head self-attention with optional grouped-query heads and KV cache.

Attention receives its layer's ``PositionContext`` and uses it the same way whatever the
encoding or layer type: ``ctx.rotate`` on q and k, ``ctx.bias`` and the decay on the scores,
``ctx.window`` as its span. What is the layer's own is here: the temperature on its queries
(model/temperature.py) and its attention sinks, both from its layer type
(model/layer_config.py).

Paths, fastest first:
- full span, no bias, no sinks, no cache: ``F.scaled_dot_product_attention`` with the fused
  ``is_causal`` path;
- on CUDA, a distance-only bias, a window, sinks or a decay: FlexAttention
  (model/flex_attention.py), which skips the blocks a mask excludes;
- one new query against the cache (decoding): two small matmuls;
- otherwise queries in chunks with an explicit mask, so a long sequence never
  materialises a full (H, T, T) bias; memory grows with chunk × T instead of T². A chunk
  sees only the keys its queries may (causal, and within a window), so a sliding-window
  layer's cost grows with T × window. A contextual bias (CoPE, DAPE) or sinks need the
  scores themselves: such chunks form them in float32 (model/attention_scores.py).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ropelab.model.attention_scores import added_bias, explicit_scores, softmax_with_sinks, visible
from ropelab.model.config import ModelConfig
from ropelab.model.flex_attention import flex_attention_layer, usable_for_flex
from ropelab.model.kv_cache import KVCache
from ropelab.model.layer_config import LayerType
from ropelab.model.layers import QKVProjection
from ropelab.model.positional import PositionContext
from ropelab.model.temperature import Temperature


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: Optional[LayerType] = None):
        super().__init__()
        layer = layer or LayerType(pos=cfg.pos)
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.wqkv = QKVProjection(cfg)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.init_std = cfg.init_std
        self.temperature = Temperature(layer.temperature, cfg.n_heads) if layer.temperature.kind != "none" else None
        self.sinks = nn.Parameter(torch.zeros(cfg.n_heads)) if layer.sinks else None
        self.cache: Optional[KVCache] = None  # attached by Transformer.setup_cache
        self.query_chunk = 512  # queries per chunk on the masked/biased path (512: fastest at 16×L)

    def reset_parameters(self) -> None:
        """The layer's own parameters beyond its projections (those are the model's generic init)."""
        if self.sinks is not None:  # N(0, init_std), as transformers initialises gpt-oss's sinks
            nn.init.normal_(self.sinks, mean=0.0, std=self.init_std)
        if self.temperature is not None:
            self.temperature.reset_parameters()

    def forward(self, x: torch.Tensor, ctx: PositionContext) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.wqkv(x)  # (B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, D)
        q, k = ctx.rotate(q, k)
        if self.temperature is not None:
            q = self.temperature(q, ctx)
        decay = ctx.log_forget(x).cumsum(-1) if ctx.decays and self.cache is None else None  # (B, H, T)
        k_positions, k_decay = ctx.positions, decay
        if self.cache is not None:
            # The host knows where the new tokens go when the Transformer made the positions.
            start = ctx.first_position if ctx.first_position is not None else int(ctx.positions[0])
            if ctx.decays:
                decay = self.cache.running_decay(start, ctx.log_forget(x))
            k, v, k_positions, k_decay = self.cache.update(start, k, v, decay)
        dropout = self.dropout if self.training else 0.0
        plain = not ctx.has_bias and ctx.window is None and self.sinks is None
        if self.cache is None and plain:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, dropout_p=dropout)
        elif self.cache is None and usable_for_flex(q, ctx, dropout):
            y = flex_attention_layer(q, k, v, ctx, decay, self.sinks)
        elif T == 1 and self.cache is not None and not ctx.contextual:
            y = self._decode_step(q, k, v, ctx, k_positions, decay, k_decay)
        else:
            y = self._chunked(q, k, v, ctx, k_positions, decay, k_decay, same_tokens=self.cache is None)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))  # (B, T, d)

    def _decode_step(self, q, k, v, ctx: PositionContext, k_positions, q_decay, k_decay) -> torch.Tensor:
        """One new query against the cache: two small matmuls instead of the fused kernel,
        whose fixed cost per call (~3 ms on a 2-core CPU) was most of a decoding step. Query
        heads are grouped under their key/value head, so GQA needs no copies of k and v."""
        B, _, _, D = q.shape
        groups = self.n_heads // self.n_kv_heads
        qg = q.view(B, self.n_kv_heads, groups, D)  # (B, Hkv, G, D): the single position folded in
        scores = (qg @ k.transpose(-2, -1)).float() / math.sqrt(D)  # (B, Hkv, G, Tk)
        bias = added_bias(ctx, ctx.positions, k_positions, q_decay, k_decay)  # (H, 1, Tk) or (B, H, 1, Tk)
        if bias is not None:
            scores = scores + bias.reshape(-1, self.n_kv_heads, groups, bias.shape[-1])
        if ctx.window is not None:  # ring slots outside the window (not written yet) are hidden
            scores = scores.masked_fill(~visible(ctx.positions, k_positions, ctx.window), float("-inf"))
        probs = softmax_with_sinks(scores, None if self.sinks is None else self.sinks.view(self.n_kv_heads, groups))
        probs = F.dropout(probs, self.dropout, self.training).to(v.dtype)
        return (probs @ v).view(B, self.n_heads, 1, D)  # (B, H, 1, D)

    def _chunked(self, q, k, v, ctx: PositionContext, k_positions, q_decay, k_decay,
                 same_tokens: bool) -> torch.Tensor:
        """Attention over query chunks with an explicit mask and the layer's bias.

        ``same_tokens``: keys are the queries' own tokens (no cache), so with ascending
        positions a chunk ending at query index e sees only keys before e, and with a window
        w none before its first query − w + 1: the others are dropped instead of masked, which
        halves the work of a long biased sequence and makes a window's cost linear in T.
        """
        dropout = self.dropout if self.training else 0.0
        explicit = ctx.contextual or self.sinks is not None
        outputs = []
        for start in range(0, q.shape[2], self.query_chunk):
            end = start + min(self.query_chunk, q.shape[2] - start)
            qp, qc = ctx.positions[..., start:end], q[:, :, start:end]  # (tq,) or (B, tq)
            qd = None if q_decay is None else q_decay[..., start:end]
            kc, vc, kp, kd = k, v, k_positions, k_decay
            if same_tokens:
                first = 0 if ctx.window is None else max(0, start - ctx.window + 1)
                kc, vc, kp = k[:, :, first:end], v[:, :, first:end], k_positions[..., first:end]
                kd = None if k_decay is None else k_decay[..., first:end]
            if explicit:
                outputs.append(self._explicit_chunk(qc, kc, vc, ctx, qp, kp, qd, kd, dropout).to(q.dtype))
                continue
            mask = visible(qp, kp, ctx.window).unsqueeze(-3)  # (…, 1, tq, Tk), True = may attend
            bias = added_bias(ctx, qp, kp, qd, kd)  # (…, H, tq, Tk) float32, or None
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

    def _explicit_chunk(self, q, k, v, ctx: PositionContext, qp, kp, qd, kd, dropout: float) -> torch.Tensor:
        """softmax(scores) v for one query chunk, all in float32 (model/attention_scores.py):
        the contextual bias is a function of the masked logits, and sinks join the softmax."""
        with _full_precision(q):
            groups = self.n_heads // self.n_kv_heads
            if groups > 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            scores = explicit_scores(q, k, ctx, qp, kp, qd, kd)
            sinks = None if self.sinks is None else self.sinks.view(-1, 1)  # (H, 1) against (B, H, tq, Tk)
            probs = F.dropout(softmax_with_sinks(scores, sinks), dropout, self.training)
            return probs @ v.float()

    def new_cache(self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device,
                  window: Optional[int] = None, decays: bool = False) -> KVCache:
        return KVCache(batch_size, max_len, self.n_kv_heads, self.head_dim, dtype, device, window=window,
                       decay_heads=self.n_heads if decays else None)

    def flops_per_token(self, seq_len: int, window: Optional[int] = None) -> float:
        """Forward matmul FLOPs per token, projections excluded: QKᵀ and AV over the keys a query
        sees, ``seq_len`` (or the window) without the causal halving (PaLM, Chowdhery et al.
        2022, App. B; nanoGPT's MFU)."""
        return 4 * self.n_heads * self.head_dim * (seq_len if window is None else min(window, seq_len))


def _full_precision(x: torch.Tensor):
    """A context where autocast is off on ``x``'s device (the explicit path is float32)."""
    return torch.autocast(x.device.type, enabled=False)
