"""Causal linear attention (Katharopoulos et al. 2020) with RoPE in the numerator only.

With a non-negative feature map φ, query i attends to keys j ≤ i as (their §3.2-3.3)

    y_i = Σ_j φ(q_i)ᵀφ(k_j) v_j / Σ_j φ(q_i)ᵀφ(k_j),

φ(x) = elu(x) + 1 by default; no 1/√d scale, as in the paper. Nothing of size T × T is
needed: the sums over j are running sums (their §3.3-3.4), which makes decoding a
recurrence with a constant-size state (model/linear_state.py).

**RoPE** (Su et al. 2021, RoFormer §3.3, eq. 19) rotates inside the numerator only:

    y_i = Σ_j [R_i φ(q_i)]ᵀ[R_j φ(k_j)] v_j / Σ_j φ(q_i)ᵀφ(k_j).

Rotating the denominator too could make it zero or negative. R_iᵀR_j = R_{j−i}, so the
numerator depends on positions only through j − i. The rotation is the encoding's own
(``ctx.rotate``, applied to φ(q) and φ(k)), so both pairings, partial rotary and every
scaling act as they do in softmax attention. YaRN's attention factor m multiplies its
cos/sin; here it therefore scales the rotated part of the numerator by m² (in softmax
attention it sharpens the distribution instead). Additive absolute encodings act at the
input and NoPE not at all; score biases cannot work (there is no score matrix), which
``ModelConfig`` refuses before any work.

**Two forms, one result.** ``chunked_linear_attention`` (training, evaluation, prefill)
splits the sequence into chunks of C positions: within a chunk a masked C × C product,
across chunks the running state S = Σ R_j φ(k_j) v_jᵀ at each chunk's start (the
chunkwise form of Hua et al. 2022, FLASH, and Yang et al. 2023, GLA). Memory is linear in
T (C·T scores, T·D²/C state entries per head); C = 64 balances the two for head_dim 64.
``recurrent_linear_attention`` (decoding) adds one token at a time to S and z = Σ φ(k_j):
keys are rotated once, at their own position, when they enter S, and each query is
rotated at its position when it reads S, exactly like keys entering a KV cache. The
denominator needs no chunks: it is φ(q_i)ᵀz_i with z_i a cumulative sum.

**Denominator guard.** φ(q_i)ᵀz_i = |φ(q_i)| |z_i| cos θ_i is positive in exact arithmetic
(elu + 1 > 0) but can be arbitrarily small against the numerator, whose rotated terms do
not shrink with it (with ``relu`` it can be exactly 0 while the numerator is not). We floor
cos θ_i at ``MIN_COSINE`` = 1e-3: the denominator is max(φ(q_i)ᵀz_i, 1e-3·|φ(q_i)| |z_i|).
The floor is scale-free (an absolute ε means nothing when features are large or tiny),
leaves every normal position exactly on the formula, and bounds the total absolute
attention weight Σ_j |w_ij| by √D / 1e-3 (for non-negative φ, |z| ≥ Σ_j|φ(k_j)| / √D), so
|y_i| ≤ √D · 1000 · max_j |v_j|. A zero φ(q_i) or z_i (a zero numerator) gives y_i = 0.

**Precision.** Running sums (the chunk states, z, the decoding state) and the division are
float32 whatever the model dtype; the matrix products of the chunked form run in the model
dtype (under bf16 autocast: bf16 operands, including the state read by each chunk).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ropelab.model.config import ModelConfig
from ropelab.common.errors import ConfigError
from ropelab.model.layers import QKVProjection
from ropelab.model.linear_state import LinearState
from ropelab.model.positional import PositionContext

Tensor = torch.Tensor
State = tuple[Tensor, Tensor]  # (S (B, Hkv, D, Dv), z (B, Hkv, D)), float32

FEATURE_MAPS: dict[str, Callable[[Tensor], Tensor]] = {
    "elu": lambda x: F.elu(x) + 1.0,  # Katharopoulos et al. 2020, eq. 7
    "relu": F.relu,  # cosFormer (Qin et al. 2022)
}
MIN_COSINE = 1e-3  # the denominator guard (module docstring)


def _normalize(num: Tensor, fq: Tensor, z: Tensor) -> Tensor:
    """num (…, T, Dv) / guarded φ(q)ᵀz, with fq (…, T, D) and z broadcastable to it, float32."""
    fq, z = fq.float(), z.float()
    den = (fq * z).sum(-1)  # (…, T)
    floor = MIN_COSINE * fq.norm(dim=-1) * z.norm(dim=-1)
    den = torch.maximum(den, floor).clamp_min(torch.finfo(torch.float32).tiny)
    return num.float() / den[..., None]


def chunked_linear_attention(fq: Tensor, fk: Tensor, rq: Tensor, rk: Tensor, v: Tensor,
                             chunk_size: int, state: Optional[State] = None) -> tuple[Tensor, State]:
    """Causal linear attention over a whole sequence, in chunks; returns (y, final state).

    fq, rq: φ(q) and R φ(q), (B, Hkv, G, T, D) with the G query heads of each key/value head
    grouped under it (GQA needs no copies of k and v); fk, rk: φ(k) and R φ(k), (B, Hkv, T, D);
    v: (B, Hkv, T, Dv). ``state`` continues earlier positions (chunked prefill). y is
    float32, (B, Hkv, G, T, Dv).
    """
    B, Hkv, G, T, D = rq.shape
    C = min(chunk_size, T)
    N = -(-T // C)
    pad = N * C - T  # zero features after the last position: they add nothing to any sum
    rq, rk, v = (F.pad(t, (0, 0, 0, pad)) for t in (rq, rk, v))
    rq = rq.view(B, Hkv, G, N, C, D)
    rk = rk.view(B, Hkv, N, C, D)
    v = v.view(B, Hkv, N, C, -1)  # (B, Hkv, N, C, Dv)
    causal = torch.ones(C, C, dtype=torch.bool, device=rq.device).tril()
    scores = (rq @ rk.unsqueeze(2).transpose(-2, -1)).masked_fill(~causal, 0)  # (B, Hkv, G, N, C, C)
    num = scores @ v.unsqueeze(2)  # (B, Hkv, G, N, C, Dv): keys in the query's own chunk
    chunk_kv = (rk.transpose(-2, -1) @ v).float()  # (B, Hkv, N, D, Dv): each chunk's Σ R_j φ(k_j) v_jᵀ
    before = torch.cat((torch.zeros_like(chunk_kv[:, :, :1]), chunk_kv[:, :, :-1].cumsum(2)), dim=2)
    kv0, z0 = state if state is not None else (None, None)
    if kv0 is not None:
        before = before + kv0[:, :, None]
    num = num.float() + rq @ before.unsqueeze(2).to(rq.dtype)  # keys of earlier chunks
    num = num.reshape(B, Hkv, G, N * C, -1)[:, :, :, :T]  # (B, Hkv, G, T, Dv)
    z = fk.float().cumsum(2)  # (B, Hkv, T, D): z_i = Σ_{j≤i} φ(k_j)
    if z0 is not None:
        z = z + z0[:, :, None]
    y = _normalize(num, fq, z.unsqueeze(2))
    return y, (before[:, :, -1] + chunk_kv[:, :, -1], z[:, :, -1])


def recurrent_linear_attention(fq: Tensor, fk: Tensor, rq: Tensor, rk: Tensor, v: Tensor,
                               state: Optional[State] = None) -> tuple[Tensor, State]:
    """The same attention one position at a time, from a constant-size state (decoding).

    Shapes as in ``chunked_linear_attention``; each step adds R_t φ(k_t) v_tᵀ to S and
    φ(k_t) to z, then reads them with R_t φ(q_t) and φ(q_t).
    """
    B, Hkv, G, T, D = rq.shape
    if state is None:
        state = (torch.zeros(B, Hkv, D, v.shape[-1], device=v.device),
                 torch.zeros(B, Hkv, D, device=v.device))
    kv, z = state
    outputs = []
    for t in range(T):
        kv = kv + rk[:, :, t, :, None].float() * v[:, :, t, None, :].float()  # (B, Hkv, D, Dv)
        z = z + fk[:, :, t].float()  # (B, Hkv, D)
        num = rq[:, :, :, t].float() @ kv  # (B, Hkv, G, Dv)
        outputs.append(_normalize(num, fq[:, :, :, t], z.unsqueeze(2)))
    return torch.stack(outputs, dim=3), (kv, z)  # (B, Hkv, G, T, Dv)


class LinearAttention(nn.Module):
    """Causal linear attention with the projections of ``Attention`` (same names, same shapes)."""

    def __init__(self, cfg: ModelConfig, layer: object = None):  # its layer type: plain (ModelConfig checks)
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.wqkv = QKVProjection(cfg)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.feature_map = FEATURE_MAPS[cfg.linear_attention.feature_map]
        self.cache: Optional[LinearState] = None  # attached by Transformer.setup_cache
        self.chunk_size = 64  # positions per chunk (module docstring)

    def forward(self, x: Tensor, ctx: PositionContext) -> Tensor:
        if ctx.has_bias:  # ModelConfig refuses this pairing; a hand-built model must not pass silently
            raise ConfigError("linear attention has no score matrix to add a positional bias to; "
                              "use an encoding without a score bias, or model.attention=softmax")
        B, T, _ = x.shape
        G, D = self.n_heads // self.n_kv_heads, self.head_dim
        q, k, v = self.wqkv(x)  # (B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, D)
        fq, fk = self.feature_map(q), self.feature_map(k)
        rq, rk = ctx.rotate(fq, fk)  # the numerator's features; the denominator keeps fq, fk
        fq, rq = fq.view(B, self.n_kv_heads, G, T, D), rq.view(B, self.n_kv_heads, G, T, D)  # (B, Hkv, G, T, D)
        if self.cache is None:
            y, _ = chunked_linear_attention(fq, fk, rq, rk, v, self.chunk_size)
        else:
            self.cache.check(ctx.positions, B)
            state = (self.cache.kv, self.cache.k_sum)
            if T == 1:
                y, state = recurrent_linear_attention(fq, fk, rq, rk, v, state)
            else:
                y, state = chunked_linear_attention(fq, fk, rq, rk, v, self.chunk_size, state)
            self.cache.update(*state, T)
        y = y.to(v.dtype).reshape(B, self.n_heads, T, D)  # (B, H, T, D)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * D))  # (B, T, d)

    def new_cache(self, batch_size: int, max_len: int, dtype: torch.dtype,
                  device: torch.device, window: Optional[int] = None, decays: bool = False) -> LinearState:
        """The decoding state: two running sums per key/value head, float32 (linear_state.py)."""
        return LinearState(batch_size, max_len, self.n_kv_heads, self.head_dim, device)

    def flops_per_token(self, seq_len: int, window: Optional[int] = None) -> float:
        """Forward matmul FLOPs per token of the chunked form, projections excluded (a linear
        layer has no window: the config refuses one).

        Per query head: 2·C·D for the scores within the chunk and 2·C·D for applying them
        (full C × C blocks, as executed, like softmax's count without the causal halving),
        2·D² to read the state, 2·D for the denominator; per key/value head 2·D² to build
        the chunk states. C = min(chunk_size, seq_len).
        """
        C, D = min(self.chunk_size, seq_len), self.head_dim
        return self.n_heads * (4 * C * D + 2 * D * D + 2 * D) + self.n_kv_heads * 2 * D * D
