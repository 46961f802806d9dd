"""Architecture config: what the network is, never how it is run.

Batch sizes, cache lengths and evaluation lengths are runtime arguments. Each dataclass
validates itself in ``__post_init__`` so an impossible model fails before any work starts;
``configs/`` turns YAML into these objects and names the file and key on error.

Lengths, one word each (the whole project uses these names):

- ``seq_len`` (``train.seq_len``): the training length L, tokens per training sequence.
- ``original_max_len`` (``pos.rope.scaling``): the length L0 a RoPE scaling extends from;
  normally the training length (transformers calls it original_max_position_embeddings).
- ``max_len``: a capacity in positions: the rows of a learned table (``pos.max_len``, and
  ``PositionalEncoding.max_len``, None where unbounded; xPos's is fixed by float range),
  the slots of a KV cache, the cap on prompt + new tokens in generation, the range
  [0, max_len) randomized training positions are drawn from (``train.random_positions``).
- ``fit_len``: the length of the whole sequence a forward belongs to, which dynamic NTK
  fits its frequencies to: the forward's own length, or with a KV cache the cache's
  ``max_len`` (generation sizes it to prompt + max_new_tokens).
- ``length``: an evaluation window length (eval/).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Literal, Optional

from ropelab.common.errors import ConfigError
from ropelab.model.encodings import KINDS, POS_KINDS, kinds_where
from ropelab.model.layer_config import LayerPlan, LayerType, TemperatureConfig, check_plan, layer_names
from ropelab.model.pos_config import (SCALING_TYPES, XPOS_MAX_LOG2, CopeConfig, FireConfig, PosConfig, RopeConfig,
                                      RopeScalingConfig, ScalingType, T5BiasConfig, XposConfig)

# Re-exported: the positional configs live in model/pos_config.py, the layer plan in
# model/layer_config.py; ``from ropelab.model.config import PosConfig`` keeps working.
__all__ = ["ATTENTION_KINDS", "FEATURE_MAPS", "POS_KINDS", "SCALING_TYPES", "XPOS_MAX_LOG2", "AttentionKind",
           "CopeConfig", "FeatureMap", "FireConfig", "LayerPlan", "LayerType", "LinearAttentionConfig", "ModelConfig",
           "PosConfig", "RopeConfig", "RopeScalingConfig", "ScalingType", "T5BiasConfig", "TemperatureConfig",
           "XposConfig"]

AttentionKind = Literal["softmax", "linear"]
FeatureMap = Literal["elu", "relu"]
# The one list of each, for every CLI, the benchmark and the tests (the encodings' list,
# POS_KINDS, and what each encoding is and allows are in model/encodings.py).
ATTENTION_KINDS: tuple[str, ...] = typing.get_args(AttentionKind)
FEATURE_MAPS: tuple[str, ...] = typing.get_args(FeatureMap)


def _rope_differences(rope: RopeConfig, default: RopeConfig) -> list[str]:
    """What a layer type's RoPE changes from the default layer's, for its name in a plan:
    ``θ1e+06`` (its base), ``linear×8`` (a scaling in training; ``unscaled`` where the default
    layer scales and the type does not), ``interleaved`` (its pairing), ``r0.5`` (its
    rotary_fraction), ``p0.75`` (its frequency_fraction)."""
    bits = [f"θ{rope.theta:g}"] if rope.theta != default.theta else []
    if rope.scaling != default.scaling:
        bits.append("unscaled" if rope.scaling.type == "none" else f"{rope.scaling.type}×{rope.scaling.factor:g}")
    bits += [rope.pairing] if rope.pairing != default.pairing else []
    bits += [f"r{rope.rotary_fraction:g}"] if rope.rotary_fraction != default.rotary_fraction else []
    bits += [f"p{rope.frequency_fraction:g}"] if rope.frequency_fraction != default.frequency_fraction else []
    return bits


@dataclass
class LinearAttentionConfig:
    """Causal linear attention (Katharopoulos et al. 2020); see model/linear_attention.py.

    ``feature_map`` is the non-negative φ of sim(q, k) = φ(q)ᵀφ(k): ``elu`` is
    φ(x) = elu(x) + 1 (their eq. 7), ``relu`` is φ(x) = max(x, 0) (cosFormer, Qin et al.
    2022). Read only when ``model.attention`` is ``linear``.
    """

    feature_map: FeatureMap = "elu"

    def __post_init__(self) -> None:
        # The loader checks the Literal for YAML; this also covers configs built in Python.
        if self.feature_map not in FEATURE_MAPS:
            raise ConfigError(f"model.linear_attention.feature_map={self.feature_map!r} is not a "
                              f"known feature map; choose one of {', '.join(FEATURE_MAPS)}")


@dataclass
class ModelConfig:
    """A LLaMA-style decoder: RMSNorm, SwiGLU, no biases, optional GQA and tied head."""

    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: Optional[int] = None  # None: n_heads (plain multi-head attention)
    ffn_hidden: Optional[int] = None  # None: LLaMA's 2/3 * 4 * d_model rounded up to multiple_of
    multiple_of: int = 32
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02
    pos: PosConfig = field(default_factory=PosConfig)
    # softmax: softmax(qkᵀ/√d) v. linear: causal linear attention, O(1) state per token when
    # decoding; RoPE then rotates the numerator only (model/linear_attention.py).
    attention: AttentionKind = "softmax"
    linear_attention: LinearAttentionConfig = field(default_factory=LinearAttentionConfig)
    # Layers that differ (model/layer_config.py); empty: every layer is the default layer.
    layers: LayerPlan = field(default_factory=LayerPlan)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "multiple_of"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be a positive integer (got {getattr(self, name)})")
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model={self.d_model} is not divisible by "
                              f"model.n_heads={self.n_heads}")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise ConfigError(f"model.n_heads={self.n_heads} is not divisible by "
                              f"model.n_kv_heads={self.n_kv_heads}")
        if self.ffn_hidden is not None and self.ffn_hidden < 1:
            raise ConfigError("model.ffn_hidden must be a positive integer or null")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1) (got {self.dropout})")
        if self.init_std <= 0:
            raise ConfigError("model.init_std must be positive")
        if not self.norm_eps > 0:
            raise ConfigError(f"model.norm_eps must be positive (got {self.norm_eps}); RMSNorm divides by "
                              "sqrt(mean(x²) + norm_eps)")
        self._check_pos()
        self._check_attention()
        if not self.layers.uniform:
            self._check_plan()

    def _check_pos(self) -> None:
        row = KINDS[self.pos.kind]
        if row.rotary:
            self._check_rotary()
        if not row.rope_scaling and self.pos.rope.scaling.type != "none":
            raise ConfigError(f"pos.rope.scaling.type={self.pos.rope.scaling.type} scales RoPE's frequencies, but "
                              f"pos.kind={self.pos.kind} has none; use pos.kind="
                              f"{' or '.join(kinds_where('rope_scaling'))}, or scaling type none")
        if row.pairs_d_model and self.d_model % 2:
            raise ConfigError(f"pos.kind={self.pos.kind} needs an even d_model (sin/cos pairs)")

    def _check_plan(self) -> None:
        """Each layer type is a model of its own as far as its encoding goes (the same checks,
        naming the type), plus what only a plan can get wrong."""
        check_plan(self.layers, self.n_layers)
        default_additive = KINDS[self.pos.kind].additive
        for name, layer in self.layers.types.items():
            where = f"model.layers.types.{name}"
            if (KINDS[layer.pos.kind].additive or default_additive) and layer.pos != self.pos:
                raise ConfigError(f"{where}.pos: an additive encoding ({'model.pos.kind=' + self.pos.kind if default_additive else 'pos.kind=' + layer.pos.kind}) "
                                  "acts once, on the token embeddings at the input, so no layer type can set, change "
                                  "or drop it; give it as model.pos and leave the types' pos alone")
            try:
                self.for_layer_type(layer)
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from None
            if self.attention == "linear" and not layer.plain:
                raise ConfigError(f"{where}: a window, attention sinks or a temperature act on the softmax's scores, "
                                  "which linear attention (model.attention=linear) never forms; use "
                                  "model.attention=softmax for such layers")

    def for_layer_type(self, layer: LayerType) -> ModelConfig:
        """This model as one layer type sees it: its ``pos``, no plan (an encoding is built from it)."""
        if layer.pos is self.pos and self.layers.uniform:
            return self
        return dataclasses.replace(self, pos=layer.pos, layers=LayerPlan())

    def layer_types(self) -> list[LayerType]:
        """The type of every layer, in order; a uniform model's layers are all the default layer."""
        if self.layers.uniform:
            return [LayerType(pos=self.pos)] * self.n_layers
        return [self.layers.types[name] for name in layer_names(self.layers, self.n_layers)]

    def layer_names(self) -> list[str]:
        """Each layer's type name ("" for a uniform model's)."""
        return layer_names(self.layers, self.n_layers)

    def encoding_name(self) -> str:
        """What report rows call this model's positions: the kind of a uniform model
        (``rope``), a plan's types in pattern order with what each changes, then the pattern
        (``rope·w64/none [SSSN]``): never a plain kind, so a plan is its own row and colour."""
        if self.layers.uniform:
            return self.pos.kind
        parts = []
        for name in dict.fromkeys(self.layers.pattern):
            layer = self.layers.types[name]
            bits = [layer.pos.kind]
            if KINDS[layer.pos.kind].rotary:
                bits += _rope_differences(layer.pos.rope, self.pos.rope)
            bits += [f"w{layer.window}"] if layer.window else []
            bits += ["sinks"] if layer.sinks else []
            bits += [layer.temperature.kind] if layer.temperature.kind != "none" else []
            parts.append("·".join(bits))
        return f"{'/'.join(parts)} [{self.layers.pattern}]"

    def _check_attention(self) -> None:
        """Refuse an attention kind the encoding or the dropout setting cannot work with."""
        if self.attention not in ATTENTION_KINDS:
            raise ConfigError(f"model.attention={self.attention!r} is not an attention kind; "
                              f"choose one of {', '.join(ATTENTION_KINDS)}")
        if self.attention != "linear":
            return
        if KINDS[self.pos.kind].forms_scores:
            usable = ", ".join(k for k in POS_KINDS if not KINDS[k].forms_scores)
            raise ConfigError(
                f"pos.kind={self.pos.kind} adds a bias or a decay to the attention scores, but linear attention "
                "(model.attention=linear) never forms the score matrix: there is no attention matrix "
                f"to bias. Use one of {usable} with linear attention, or model.attention=softmax.")
        if self.dropout > 0:
            raise ConfigError(
                f"model.dropout={self.dropout} also drops attention weights, which linear attention "
                "(model.attention=linear) never forms, so the setting cannot be honoured; set "
                "model.dropout=0 with linear attention, or use model.attention=softmax.")

    def _check_rotary(self) -> None:
        rot = self.head_dim * self.pos.rope.rotary_fraction
        if rot != int(rot) or int(rot) % 2 or rot < 2:
            raise ConfigError(
                f"RoPE rotates head_dim * rotary_fraction = {self.head_dim} * "
                f"{self.pos.rope.rotary_fraction} = {rot:g} dims per head; that must be an "
                "even whole number >= 2 (dims rotate in pairs). Change rotary_fraction.")
        if self.kept_frequencies < 1:
            raise ConfigError(
                f"pos.rope.frequency_fraction={self.pos.rope.frequency_fraction} keeps none of the "
                f"{self.rotary_dim // 2} RoPE frequencies (it keeps floor(fraction * {self.rotary_dim // 2})); "
                f"use at least {2 / self.rotary_dim:.3g}, or pos.kind=none for no rotation at all")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.pos.rope.rotary_fraction)

    @property
    def kept_frequencies(self) -> int:
        """RoPE frequencies that rotate: floor(frequency_fraction · rotary_dim/2), the highest
        ones (Barbero et al. 2024's rule; rounded first so 0.29 · 100 counts as 29)."""
        return math.floor(round(self.pos.rope.frequency_fraction * (self.rotary_dim // 2), 9))

    @property
    def hidden_dim(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        hidden = int(2 * 4 * self.d_model / 3)  # LLaMA: SwiGLU keeps the 4d MLP's parameter count
        return self.multiple_of * math.ceil(hidden / self.multiple_of)
