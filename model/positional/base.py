"""The positional-encoding interface, the per-forward context it prepares, and NoPE.

An encoding may act in four places and overrides only what it needs:

- ``embed(x, positions)``: additive absolute encodings at the input;
- ``rotation(positions, fit_len)``: RoPE and its relatives, a prepared rotation of q and k;
- ``bias(q_positions, k_positions)``: a per-head additive bias on attention scores (ALiBi,
  T5, Kerple, FIRE);
- ``contextual_bias(layer, q, logits, bias)``: a score bias that depends on the content as
  well (CoPE, DAPE): attention forms each layer's scaled, causally masked logits q·kᵀ/√d
  (and the encoding's own ``bias`` for those pairs, or None) and the encoding returns what
  to add to them;
- ``log_forget(layer, x)``: a data-dependent decay (the Forgetting Transformer): from the
  layer's input x, a per-head log forget gate per token, whose sums between key and query
  are added to the scores (attention keeps the running sum in its KV cache).

``Transformer.forward`` asks each distinct encoding once per forward for a
``PositionContext`` (the rotation with its cos/sin already gathered for this forward's
positions, and the bias function, with whatever it learns precomputed by
``prepare_bias``), and hands each block that context for its own layer (``for_layer``: its
index and its attention span, the window of its layer type, model/layer_config.py);
attention uses it without ever asking which encoding or layer type made it.
Positions are an explicit integer tensor: (T,), shared by the batch, or (B, T) on the
training path when each sequence has its own (randomized positions, Ruoss et al. 2023);
a bias is then (H, Tq, Tk) or (B, H, Tq, Tk). Tables, angles and biases are float32
whatever the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
from torch import nn

from ropelab.common.errors import LengthError

Tensor = torch.Tensor
Rotate = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (q, k) -> rotated (q, k)
Bias = Callable[[Tensor, Tensor], Tensor]  # (…, Tq), (…, Tk) positions -> (…, H, Tq, Tk) float32
# (layer, q (B, H, Tq, D), logits (B, H, Tq, Tk) with −inf where masked, the encoding's bias
# (…, H, Tq, Tk) or None) -> (B, H, Tq, Tk) float32
ContextualBias = Callable[[int, Tensor, Tensor, Optional[Tensor]], Tensor]
# (layer, x (B, T, d_model)) -> log forget gates (B, H, T) float32, each ≤ 0
LogForget = Callable[[int, Tensor], Tensor]


def causal_distance(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """i − j for every query i and key j, clamped at 0: (Tq, Tk), or (B, Tq, Tk) per sequence.

    Keys after the query (negative distances) are masked by attention anyway; clamping
    keeps them valid table indices.
    """
    return (q_positions[..., :, None] - k_positions[..., None, :]).clamp(min=0)


# eq=False here and on the rotations: identity hashing. A generated __hash__ reads the
# fields, and torch.compile (seen with 2.11 on CUDA) hashes such an object while tracing,
# before the fields of one built inside the graph exist ("no attribute 'table'").
@dataclass(frozen=True, eq=False)
class DistanceBias:
    """A per-forward bias that depends on the causal distance only: ``table[h, i − j]``."""

    table: Tensor  # (H, fit_len) float32: the bias at causal distance 0 … fit_len−1

    def __call__(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        # Clamped into the table: keys beyond it (a ring cache's empty slots) are masked anyway.
        distance = causal_distance(q_positions, k_positions).clamp(max=self.table.shape[1] - 1)
        if distance.dim() == 2:
            return self.table[:, distance]  # (H, Tq, Tk); one index tensor: the fastest gather
        heads = torch.arange(self.table.shape[0], device=distance.device).view(-1, 1, 1)
        return self.table[heads, distance.unsqueeze(-3)]  # (B, H, Tq, Tk)


@dataclass(frozen=True, eq=False)
class PositionContext:
    """What one layer needs from its encoding for one forward, prepared once per encoding.

    ``rotate`` acts on queries and keys of this forward's ``positions`` (keys entering a
    KV cache are rotated at their own positions, once); ``bias`` gives the score bias
    between any query and key positions (query chunks, cached keys); ``window`` is the
    layer's attention span (None: every earlier key); ``log_forget`` the layer's decay.
    """

    positions: Tensor  # (T,) or (B, T)
    rotate_qk: Optional[Rotate] = None
    bias_fn: Optional[Bias] = None
    contextual_fn: Optional[ContextualBias] = None
    layer: int = 0  # the block this context is handed to (``for_layer``)
    window: Optional[int] = None  # keys i − window < j ≤ i are visible to the query at i
    log_forget_fn: Optional[LogForget] = None
    # ``positions`` are first_position … first_position + T − 1, known on the host (the
    # Transformer made them): a KV cache writes there without reading the device, and a
    # block mask of a sequence from 0 is reused. None: positions given as a tensor.
    first_position: Optional[int] = None

    @property
    def has_bias(self) -> bool:
        """Whether the scores gain anything beyond q·kᵀ/√d (else the fused causal path)."""
        return self.bias_fn is not None or self.contextual_fn is not None or self.log_forget_fn is not None

    @property
    def contextual(self) -> bool:
        """Whether attention must hand its logits to ``contextual_bias``."""
        return self.contextual_fn is not None

    @property
    def decays(self) -> bool:
        """Whether the layer adds a data-dependent decay (its cumulative log forget gates)."""
        return self.log_forget_fn is not None

    def for_layer(self, layer: int, window: Optional[int] = None) -> PositionContext:
        """This encoding's context for block ``layer``, whose layer type spans ``window`` keys."""
        return replace(self, layer=layer, window=window)

    def at_layer(self, layer: int) -> PositionContext:
        """This context for block ``layer``, with the same span."""
        return replace(self, layer=layer)

    def contextual_bias(self, q: Tensor, logits: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """The content-dependent bias of this layer for float32 ``q``, masked ``logits`` and the
        encoding's own ``bias`` of the same pairs."""
        return self.contextual_fn(self.layer, q, logits, bias)

    def log_forget(self, x: Tensor) -> Tensor:
        """This layer's log forget gates (B, H, T) float32 for its input ``x`` (B, T, d_model)."""
        return self.log_forget_fn(self.layer, x)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return (q, k) if self.rotate_qk is None else self.rotate_qk(q, k)

    def bias(self, q_positions: Tensor, k_positions: Tensor) -> Optional[Tensor]:
        return None if self.bias_fn is None else self.bias_fn(q_positions, k_positions)

    @property
    def distance_table(self) -> Optional[Tensor]:
        """(H, fit_len) when the bias depends on the distance only (a kernel can add it in
        place: model/flex_attention.py), else None."""
        return self.bias_fn.table if isinstance(self.bias_fn, DistanceBias) else None


class PositionalEncoding(nn.Module):
    """The no-op base: NoPE (``kind: none``) is exactly this."""

    #: the ``pos.kind`` this class computes (its row in model/encodings.py; the registry's key)
    kind: str
    #: largest number of positions this encoding can serve (None: unbounded)
    max_len: Optional[int] = None
    #: whether ``bias`` is overridden (an explicit score matrix is needed)
    has_bias: bool = False
    #: whether ``contextual_bias`` is overridden (attention hands over its logits)
    contextual: bool = False
    #: whether ``log_forget`` is overridden (a data-dependent decay from the layer's input)
    decays: bool = False

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def rotation(self, positions: Tensor, fit_len: Optional[int] = None) -> Optional[Rotate]:
        """A function rotating (q, k) at ``positions``, or None; see PositionContext."""
        return None

    def bias(self, q_positions: Tensor, k_positions: Tensor) -> Optional[Tensor]:
        return None

    def contextual_bias(self, layer: int, q: Tensor, logits: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """The bias to add to block ``layer``'s ``logits`` (see ``ContextualBias``)."""
        raise NotImplementedError

    def log_forget(self, layer: int, x: Tensor) -> Tensor:
        """Block ``layer``'s log forget gates for its input ``x`` (see ``LogForget``)."""
        raise NotImplementedError

    def prepare_bias(self, fit_len: int, device: torch.device) -> Optional[Bias]:
        """The bias function of one forward whose positions are all below ``fit_len``.

        Encodings with learned biases compute what they can once here (a per-distance
        table), so every layer and query chunk only gathers from it.
        """
        return self.bias if self.has_bias else None

    def context(self, positions: Tensor, fit_len: int, first_position: Optional[int] = None) -> PositionContext:
        """Everything attention needs for one forward over ``positions`` (see module doc)."""
        return PositionContext(positions, self.rotation(positions, fit_len),
                               self.prepare_bias(fit_len, positions.device),
                               self.contextual_bias if self.contextual else None,
                               log_forget_fn=self.log_forget if self.decays else None,
                               first_position=first_position)

    def reset_parameters(self) -> None:
        """Initialise this encoding's own parameters (called after the model's generic init)."""

    def check_length(self, n_positions: int) -> None:
        """Raise LengthError if positions 0 … n_positions-1 cannot all be served."""
        if self.max_len is not None and n_positions > self.max_len:
            raise LengthError(f"pos.kind={self.kind} serves at most {self.max_len} positions but "
                              f"{n_positions} were requested; use at most {self.max_len} tokens")


class NoPE(PositionalEncoding):
    """No positional information beyond the causal mask (Kazemnejad et al. 2023)."""

    kind = "none"

    def __init__(self, cfg=None):
        super().__init__()
