"""The attention a model computes, recomputed from its own modules: what the diagnostics read.

``attention_inputs(model, idx)`` runs one forward with a pre-hook on every block's attention
layer and keeps what each layer received: its input (after the block's norm) and its
``PositionContext`` (its layer, its window). ``LayerAttention`` recomputes a softmax layer's
probabilities from that input the way the layer forms its scores: q and k from the layer's
own projection, ``ctx.rotate``, the layer's temperature on q, then the scores of
model/attention_scores.py (the one definition attention's explicit path uses: the mask of
the layer's span, a contextual bias, ``ctx.bias``, a decay from the input) and the softmax
with the layer's sinks. The model has no switch for this and does not know it is watched;
tests/unit/test_diagnostics.py checks that these probabilities times v, through the layer's
``wo``, give the layer's own output, for every encoding and layer plan and a GQA model.

``rotary_pair_norms`` gives the mean norm of each 2-D pair that RoPE rotates (Barbero et
al. 2024): of q and k in softmax attention, of the features φ(q), φ(k) that linear
attention rotates in its numerator (model/linear_attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ropelab.model.attention import Attention
from ropelab.model.attention_scores import explicit_scores, softmax_with_sinks
from ropelab.model.linear_attention import LinearAttention
from ropelab.model.positional import PositionContext
from ropelab.model.transformer import Transformer

Tensor = torch.Tensor


@dataclass
class LayerInput:
    x: Tensor  # (B, T, d_model): what the attention layer received (the block's normed stream)
    ctx: PositionContext  # the forward's context for this layer


class _Captured(Exception):
    """Raised by the hook once the last attention layer's input is known: nothing after it is needed."""


@torch.no_grad()
def attention_inputs(model: Transformer, idx: Tensor) -> list[LayerInput]:
    """What every attention layer of ``model`` received in one forward over ``idx`` (B, T),
    at positions 0 … T−1, in block order. The forward stops at the last attention layer's
    input (its attention, the last MLP and the LM head would be computed for nothing)."""
    captured: list[LayerInput] = []

    def keep(module, args):
        x, ctx = args
        captured.append(LayerInput(x.detach(), ctx))
        if len(captured) == len(model.blocks):
            raise _Captured

    handles = [block.attn.register_forward_pre_hook(keep) for block in model.blocks]
    try:
        model(idx)
    except _Captured:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return captured


def rotated_vectors(attn: Attention | LinearAttention, inp: LayerInput) -> tuple[Tensor, Tensor]:
    """(q (B, H, T, D), k (B, Hkv, T, D)) as the encoding's rotation receives them: the
    projections in softmax attention, the features φ(q), φ(k) in linear attention."""
    q, k, _ = attn.wqkv(inp.x)
    if isinstance(attn, LinearAttention):  # it rotates the features of its numerator
        q, k = attn.feature_map(q), attn.feature_map(k)
    return q, k


class LayerAttention:
    """One softmax attention layer's q and k for one input, and its probabilities for any
    query rows (so a long window is read in chunks of rows, never all T × T at once)."""

    @torch.no_grad()
    def __init__(self, attn: Attention, inp: LayerInput):
        self.unrotated = rotated_vectors(attn, inp)  # (B, H, T, D), (B, Hkv, T, D)
        q, k = inp.ctx.rotate(*self.unrotated)
        if attn.temperature is not None:
            q = attn.temperature(q, inp.ctx)
        groups = attn.n_heads // attn.n_kv_heads
        self.q = q.float()
        self.k = k.float().repeat_interleave(groups, dim=1)  # (B, H, T, D): each query head's key head
        self.ctx = inp.ctx
        self.decay = inp.ctx.log_forget(inp.x).cumsum(-1) if inp.ctx.decays else None  # (B, H, T)
        self.sinks = None if attn.sinks is None else attn.sinks.float().view(-1, 1)

    @property
    def length(self) -> int:
        return self.q.shape[2]

    @torch.no_grad()
    def probabilities(self, rows: Tensor) -> Tensor:
        """softmax over the keys of the queries at ascending indices ``rows`` (tq,): (B, H, tq, K)
        float32, K = rows[-1] + 1, exactly 0 where the causal mask hides a key. Positions
        ascend (0 … T−1 here), so the keys after the last row's query are hidden from every
        row and are left out, which halves the work of a window read in chunks."""
        keys = int(rows[-1]) + 1
        positions = self.ctx.positions
        q_positions, k_positions = positions[..., rows], positions[..., :keys]
        q_decay = k_decay = None
        if self.decay is not None:
            q_decay, k_decay = self.decay[..., rows], self.decay[..., :keys]
        scores = explicit_scores(self.q[:, :, rows], self.k[:, :, :keys], self.ctx, q_positions, k_positions,
                                 q_decay, k_decay)  # (B, H, tq, K)
        return softmax_with_sinks(scores, self.sinks)


def attention_probabilities(attn: Attention, inp: LayerInput) -> Tensor:
    """The layer's whole (B, H, T, T) probability matrix (small inputs: tests, one example map)."""
    att = LayerAttention(attn, inp)
    return att.probabilities(torch.arange(att.length, device=inp.x.device))


@torch.no_grad()
def rotary_pair_norms(q: Tensor, k: Tensor, pairing: type, rotary_dim: int) -> tuple[Tensor, Tensor]:
    """(mean ‖q⁽ⁱ⁾‖, mean ‖k⁽ⁱ⁾‖) over the tokens for each rotation pair i of ``q`` (B, H, T, D)
    and ``k`` (B, Hkv, T, D), the vectors before their rotation (``rotated_vectors``), per query
    head: (B, H, rotary_dim/2) each, a key head's norms repeated for the query heads that share
    it. A rotation keeps each pair's norm (xPos's scales do not: these are the norms without
    its decay)."""
    q_norm = pairing.pairs(q[..., :rotary_dim].float()).norm(dim=-1).mean(dim=2)  # (B, H, r/2)
    k_norm = pairing.pairs(k[..., :rotary_dim].float()).norm(dim=-1).mean(dim=2)  # (B, Hkv, r/2)
    return q_norm, k_norm.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
