"""Slow, obvious references that tests compare the model against (never used by the model).

``reference_forward`` runs a Transformer's weights with attention written out: key/value
heads copied to every query head, the full T×T score matrix with the encoding's bias over
all positions, a float32 softmax. It shares the model's embeddings, norms, MLPs and the
encoding's rotation/bias (tested on their own in test_rope/test_positional), so a
difference isolates the attention paths: fused SDPA, query chunks, the decode step. What a
layer type adds is written out here per query–key pair from its paper's formula, from the
layer plan in the config (not from the model's contexts): the window mask i − j < w, the
sinks as an extra softmax column, SSMax's s_h·ln(n_i) and Llama 4's 1 + β·ln(1 + ⌊(i+1)/c⌋)
on the logits, FoX's Σ_{l=j+1}^{i} ln f_l summed pair by pair, DAPE's MLP on (A_ij, B_ij).
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
                        mask: torch.Tensor, bias: Optional[torch.Tensor], scale: Optional[torch.Tensor] = None,
                        sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(scale·q kᵀ/√d + bias, masked, with a sink column) v with float32 scores; k/v
    already expanded to q's heads; ``scale`` (H or 1, T) multiplies each query's logits."""
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if scale is not None:
        scores = scores * scale[..., None]
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:  # one more column per head, dropped after the softmax
        column = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.cat((scores, column), dim=-1).softmax(dim=-1)[..., :-1]
    else:
        probs = scores.softmax(dim=-1)
    return (probs @ v.float()).to(q.dtype)


def reference_temperature(kind: str, cfg, attn, T: int, window: Optional[int]) -> Optional[torch.Tensor]:
    """The factor on each query's logits, per pair of the papers' formulas: (H or 1, T)."""
    if kind == "ssmax":  # s_h · ln(n_i), n_i the keys query i sees
        n = torch.tensor([float(min(i + 1, window or T + 1)) for i in range(T)])
        return attn.temperature.scale.float()[:, None] * n.log()[None, :]
    if kind == "llama4":
        return torch.tensor([[1 + cfg.beta * math.log(1 + math.floor((i + 1) / cfg.floor_scale)) for i in range(T)]])
    return None


def reference_fox_bias(log_f: torch.Tensor) -> torch.Tensor:
    """Σ_{l=j+1}^{i} ln f_l for every pair (B, H, T, T), summed pair by pair (not a cumsum)."""
    T = log_f.shape[-1]
    out = torch.zeros(*log_f.shape[:-1], T, T)
    for i in range(T):
        for j in range(i + 1):
            out[..., i, j] = log_f[..., j + 1:i + 1].sum(-1)
    return out


def reference_dape(mlp, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """DAPE's A + B + f(A, B), f applied to the heads' (A_ij, B_ij) of each pair: (B, H, T, T)."""
    w1, b1, w2, b2 = mlp[0].weight, mlp[0].bias, mlp[2].weight, mlp[2].bias
    pair = torch.cat((a, b.expand_as(a)), dim=1)  # (B, 2H, T, T)
    hidden = torch.nn.functional.leaky_relu(torch.einsum("oc,bcij->boij", w1, pair) + b1[:, None, None])
    return a + b + torch.einsum("ho,boij->bhij", w2, hidden) + b2[:, None, None]


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
    x = model.pos.embed(model.tok_emb(idx), positions)
    distance = positions[:, None] - positions[None, :]
    for layer, (block, spec) in enumerate(zip(model.blocks, model.cfg.layer_types())):
        encoding = model.encoding(layer)
        ctx = encoding.context(positions, T)
        mask = (distance >= 0) & (distance < (spec.window or T + 1))
        attn = block.attn
        h = block.attn_norm(x)
        q, k, v = project_heads(attn, h)
        q, k = ctx.rotate(q, k)
        groups = attn.n_heads // attn.n_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        bias = ctx.bias(positions, positions)
        kind = encoding.kind
        if kind == "cope":  # layer ``layer``'s embeddings
            bias = reference_cope_bias(encoding.weight[layer], q, k)
        elif kind == "fox":  # ln f_t = ln σ(w_f·h_t + b_f), the layer's own gate
            gate = encoding.gates[layer]
            bias = reference_fox_bias(torch.nn.functional.logsigmoid(h.float() @ gate.weight.T.float()
                                                                     + gate.bias.float()).transpose(1, 2))
        scale = reference_temperature(spec.temperature.kind, spec.temperature, attn, T, spec.window)
        if kind == "dape":  # the whole score A + B + f(A, B), handed over as the bias of the (scaled) logits:
            # A is the logits as the layer's temperature left them, so f sees them scaled
            a = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
            a = a if scale is None else a * scale[..., None]
            bias = reference_dape(encoding.mlps[layer], a, bias) - a
        y = reference_attention(q, k, v, mask, bias, scale, attn.sinks)
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
