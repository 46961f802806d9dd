"""Attention scores written out, as one layer forms them when it cannot use a fused kernel.

The one definition of a layer's scores, used by attention's explicit path
(model/attention.py) and by the diagnostics' attention probe (eval/diagnostics/
attention_probe.py), so what the diagnostics read is what the layer computes:

    scores_ij = q_i·k_j/√d  (+ contextual bias of the masked logits: CoPE, DAPE)
                (+ the encoding's bias b(i, j): ALiBi, T5, KERPLE, FIRE)
                (+ the decay c_i − c_j, c the running sum of log forget gates: FoX)
    over the visible keys (j ≤ i, and i − window < j for a sliding-window layer),
    then a softmax whose denominator may hold one more learned logit per head (a sink).

q arrives already rotated and scaled by the layer's temperature. Everything here is float32.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ropelab.model.positional import PositionContext

Tensor = torch.Tensor


def visible(q_positions: Tensor, k_positions: Tensor, window: Optional[int]) -> Tensor:
    """True where the query may attend the key: (…, Tq, Tk) for positions (…, Tq) and (…, Tk)."""
    distance = q_positions[..., :, None] - k_positions[..., None, :]
    mask = distance >= 0
    return mask if window is None else mask & (distance < window)


def decay_bias(q_decay: Tensor, k_decay: Tensor) -> Tensor:
    """c_i − c_j (B, H, Tq, Tk): the log of the forget gates' product between key and query."""
    return q_decay[..., :, None] - k_decay[..., None, :]


def added_bias(ctx: PositionContext, q_positions: Tensor, k_positions: Tensor,
               q_decay: Optional[Tensor], k_decay: Optional[Tensor]) -> Optional[Tensor]:
    """The encoding's bias plus the decay, float32, or None when the layer has neither."""
    bias = ctx.bias(q_positions, k_positions)
    if q_decay is not None:
        decay = decay_bias(q_decay, k_decay)
        bias = decay if bias is None else bias + decay
    return bias


def explicit_scores(q: Tensor, k: Tensor, ctx: PositionContext, q_positions: Tensor, k_positions: Tensor,
                    q_decay: Optional[Tensor] = None, k_decay: Optional[Tensor] = None) -> Tensor:
    """The layer's scores (B, H, Tq, Tk) float32, −inf where a key is not visible.

    q (B, H, Tq, D) and k (B, H, Tk, D): k already repeated for GQA.
    """
    logits = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = visible(q_positions, k_positions, ctx.window).unsqueeze(-3)  # (…, 1, Tq, Tk)
    logits = logits.masked_fill(~mask, float("-inf"))
    bias = ctx.bias(q_positions, k_positions)
    scores = logits + ctx.contextual_bias(q.float(), logits, bias) if ctx.contextual else logits
    if bias is not None:
        scores = scores + bias
    if q_decay is not None:
        scores = scores + decay_bias(q_decay, k_decay)
    return scores


def softmax_with_sinks(scores: Tensor, sinks: Optional[Tensor]) -> Tensor:
    """softmax over the last dim, with ``sinks`` as one more logit per head that takes weight
    and gives no value (gpt-oss): the probabilities of the keys then sum to less than 1.
    ``sinks`` broadcasts against ``scores.shape[:-1]``: (H, 1) for scores (B, H, Tq, Tk)."""
    if sinks is None:
        return scores.softmax(dim=-1)
    sink = sinks.float().expand(scores.shape[:-1])[..., None]
    return torch.cat((scores, sink), dim=-1).softmax(dim=-1)[..., :-1]


def sink_share(lse: Tensor, sinks: Tensor) -> Tensor:
    """What a fused kernel's output keeps once a sink joins its softmax: σ(lse − sink), from the
    log-sum-exp (B, H, T) of the keys' scores and ``sinks`` (H,); the output times it
    (B, H, T, 1) equals the softmax with the sink (``softmax_with_sinks``) times the values."""
    return torch.sigmoid(lse.float() - sinks.float().view(-1, 1))[..., None]
