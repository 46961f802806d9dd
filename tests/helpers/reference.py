"""Slow, obvious references that tests compare the model against (never used by the model).

``reference_forward`` runs a Transformer's weights with attention written out: key/value
heads copied to every query head, the full T×T score matrix with the encoding's bias over
all positions, a float32 softmax. It shares the model's embeddings, norms, MLPs and the
encoding's rotation/bias (tested on their own in test_rope/test_positional), so a
difference isolates the attention paths: fused SDPA, query chunks, the decode step.
"""

from __future__ import annotations

import math
from typing import Optional

import torch


def reference_cope_bias(embeddings: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """CoPE's q_i·e[p_ij] the long way (Golovneva et al. 2024, eqs. 3-5): gates σ(q_i·k_t/√d)
    for t ≤ i, p_ij = Σ_{t=j}^{i} g_it by a matmul with a triangular matrix, capped at
    p_max − 1, and the embedding itself interpolated, e[p] = (p − ⌊p⌋)·e[⌈p⌉] +
    (1 − p + ⌊p⌋)·e[⌊p⌋], before its dot product with q_i. (B, H, T, T); future keys 0."""
    T, D = q.shape[-2], q.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    gates = torch.sigmoid(q.float() @ k.float().transpose(-2, -1) / math.sqrt(D)) * causal  # g_it
    from_j = torch.ones(T, T).tril()  # [t, j] = 1 where t ≥ j
    p = (gates @ from_j).clamp(max=embeddings.shape[0] - 1)
    low, high = p.floor(), p.ceil()
    e = ((p - low)[..., None] * embeddings[high.long()]
         + (1 - p + low)[..., None] * embeddings[low.long()])  # (B, H, T, T, D)
    return (q.float()[..., :, None, :] * e).sum(-1) * causal


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        mask: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """softmax(q kᵀ/√d + bias, masked) v with float32 scores; k/v already expanded to q's heads."""
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(dim=-1) @ v.float()).to(q.dtype)


def attention_written_out(attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx,
                          positions: torch.Tensor) -> torch.Tensor:
    """Causal attention of ``attn``'s heads with the encoding's bias over ``positions`` ((T,) or
    (B, T), ascending), the slow way: key/value heads copied to every query head, float32 scores."""
    groups = attn.n_heads // attn.n_kv_heads
    mask = (positions[..., None, :] <= positions[..., :, None]).unsqueeze(-3)  # (…, 1, T, T): no later key
    return reference_attention(q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), mask,
                               ctx.bias(positions, positions))


def project_heads(attn, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, H, T, D) and k, v (B, H_kv, T, D) from the normed input ``h`` (B, T, C), with
    the fused projection's weights split apart."""
    B, T, _ = h.shape
    wq, wk, wv = attn.wqkv.parts()
    q = (h @ wq.T).view(B, T, attn.n_heads, attn.head_dim).transpose(1, 2)
    k = (h @ wk.T).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    v = (h @ wv.T).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    return q, k, v


@torch.no_grad()
def reference_forward(model, idx: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) of ``model`` at positions 0 … T-1, attention computed the slow way."""
    B, T = idx.shape
    positions = torch.arange(T)
    ctx = model.pos.context(positions, T)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    x = model.pos.embed(model.tok_emb(idx), positions)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        h = block.attn_norm(x)
        q, k, v = project_heads(attn, h)
        q, k = ctx.rotate(q, k)
        groups = attn.n_heads // attn.n_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        bias = ctx.bias(positions, positions)
        if model.pos.contextual:  # CoPE: layer ``layer``'s embeddings
            bias = reference_cope_bias(model.pos.weight[layer], q, k)
        y = reference_attention(q, k, v, mask, bias)
        x = x + attn.wo(y.transpose(1, 2).reshape(B, T, -1))
        x = x + block.mlp(block.mlp_norm(x))
    return model.head(model.norm(x))


def cached_logits(model, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """Logits of ``x`` fed through the model's cache (KV cache or recurrent state),
    ``chunk`` positions per call: prefill and decoding as generation does them."""
    B, T = x.shape
    model.setup_cache(B, T)
    try:
        outs = []
        for start in range(0, T, chunk):
            positions = torch.arange(start, min(start + chunk, T))
            outs.append(model(x[:, positions], positions))
        return torch.cat(outs, dim=1)
    finally:
        model.clear_cache()


@torch.no_grad()
def assert_causal(model, vocab: int = 97) -> None:
    """Changing token t + 1 leaves the logits up to t exactly as they were, and moves later ones."""
    x = torch.randint(0, vocab, (2, 20))
    for t in (0, 7, 18):
        changed = x.clone()
        changed[:, t + 1] = (changed[:, t + 1] + 1) % vocab
        a, b = model(x), model(changed)
        assert torch.equal(a[:, : t + 1], b[:, : t + 1])
        assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


class ContextFree(torch.nn.Module):
    """A bigram table: predicts each next token from the current token alone, so it uses no
    context. It answers the evaluation's calls as the Transformer does (per-target NLL, and
    ``first_target`` zeroing the context positions)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)

    def forward(self, x, targets=None, reduction="mean", first_target: int = 0):
        nll = torch.nn.functional.cross_entropy(self.table(x).transpose(1, 2), targets, reduction="none")
        if first_target:
            nll = torch.cat((torch.zeros_like(nll[:, :first_target]), nll[:, first_target:]), dim=1)
        return nll if reduction == "none" else nll.mean()
