"""A layer plan: layers that differ in encoding, attention span and temperature (``model.layers``).

The designs of 2025 mix layers: NoPE every fourth layer (Llama 4, SmolLM3), sliding-window
local layers with one RoPE base and full global layers with another (Gemma 3, gpt-oss), a
temperature on some layers only. A plan names layer types and places them with a short
pattern that repeats over the layers::

    model:
      pos: {kind: rope}          # the default layer's encoding
      layers:
        pattern: LLLG            # layer i is pattern[i % len(pattern)]
        types:
          L: {window: 32}                    # sliding window, the default encoding
          G: {pos: {rope: {theta: 1.0e6}}}   # full attention, its own RoPE base

A type is the default layer (``model.pos``, full attention, no sinks, no temperature) with
what it sets changed. Its ``pos`` merges into the default's when it keeps the default's
kind (``G`` above is RoPE at θ = 1e6 with every other RoPE setting of ``model.pos``) and
replaces it when it names another kind (``{pos: {kind: none}}`` is plain NoPE); the loader
writes each type's resolved ``pos`` into the run's config (configs/loader.py). A
``LayerType`` built in Python holds its ``pos`` whole (its default is ``PosConfig()``, not
``model.pos``): give it the encoding it should have. An empty
pattern is a uniform model: every layer is the default layer, exactly the model before
plans existed (the same module names, weights and experiment identity).

This module imports neither torch nor the rest of the model (configs and command lines read it).
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field
from typing import Literal, Optional

from ropelab.common.errors import ConfigError
from ropelab.model.pos_config import PosConfig

TemperatureKind = Literal["none", "ssmax", "llama4"]
TEMPERATURE_KINDS: tuple[str, ...] = typing.get_args(TemperatureKind)
_TYPE_NAME = re.compile(r"^[A-Za-z0-9]$")


@dataclass
class TemperatureConfig:
    """A length-dependent factor on a layer's queries, i.e. on its logits (model/temperature.py).

    - ``ssmax``, Scalable-Softmax (Nakanishi 2025, arXiv:2501.19399, eq. 2 and §3): the
      logits of a query that sees n keys are multiplied by s·log n, s learned per head and
      layer from ``ssmax_init``.
    - ``llama4``, Llama 4's temperature tuning (transformers' Llama4TextAttention): the
      query at position p is multiplied by 1 + ``beta``·log(1 + ⌊(p + 1)/``floor_scale``⌋),
      1 until position ``floor_scale`` − 1 and growing slowly past it; nothing learned.
    """

    kind: TemperatureKind = "none"
    ssmax_init: float = 0.43
    beta: float = 0.1
    floor_scale: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in TEMPERATURE_KINDS:
            raise ConfigError(f"temperature.kind={self.kind!r} is not a temperature; choose one of "
                              f"{', '.join(TEMPERATURE_KINDS)}")
        if not self.ssmax_init > 0:
            raise ConfigError(f"temperature.ssmax_init must be positive (got {self.ssmax_init}): the logits are "
                              "multiplied by s·log n")
        if not self.beta >= 0:
            raise ConfigError(f"temperature.beta must be >= 0 (got {self.beta})")
        if self.floor_scale < 1:
            raise ConfigError(f"temperature.floor_scale must be a positive integer (got {self.floor_scale})")


@dataclass
class LayerType:
    """One kind of layer: its encoding, attention span, attention sinks and temperature."""

    pos: PosConfig = field(default_factory=PosConfig)
    # Keys a query at position i sees: i − window < j ≤ i (its own and the window − 1 before
    # it, the sliding window of Mistral, Gemma 3 and gpt-oss); null: every earlier key.
    window: Optional[int] = None
    # A learned logit per head in the softmax's denominator with no value (gpt-oss's
    # attention sinks): a head may put weight on nothing.
    sinks: bool = False
    temperature: TemperatureConfig = field(default_factory=TemperatureConfig)

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ConfigError(f"window must be a positive number of tokens or null for full attention "
                              f"(got {self.window})")

    @property
    def plain(self) -> bool:
        """Whether attention is the default's apart from the encoding (full, no sinks, no temperature)."""
        return self.window is None and not self.sinks and self.temperature.kind == "none"


@dataclass
class LayerPlan:
    """Named layer types (one character each) and the pattern that places them, repeated."""

    pattern: str = ""
    types: dict[str, LayerType] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.pattern:
            if self.types:
                raise ConfigError(f"model.layers.types names {', '.join(self.types)} but model.layers.pattern is "
                                  "empty: give a pattern that places them (e.g. pattern: "
                                  f"{''.join(self.types)})")
            return
        bad = [name for name in self.types if not _TYPE_NAME.match(name)]
        if bad:
            raise ConfigError(f"model.layers.types: layer type names are one letter or digit, so a pattern spells "
                              f"them (got {', '.join(repr(b) for b in bad)})")
        unknown = sorted(set(self.pattern) - set(self.types))
        if unknown:
            raise ConfigError(f"model.layers.pattern={self.pattern!r} uses {', '.join(repr(u) for u in unknown)}, "
                              f"which model.layers.types does not define (defined: "
                              f"{', '.join(self.types) or 'none'}); a type {{}} is the default layer")
        unused = [name for name in self.types if name not in self.pattern]
        if unused:
            raise ConfigError(f"model.layers.types defines {', '.join(unused)}, which model.layers.pattern="
                              f"{self.pattern!r} never places; use it or remove it")

    @property
    def uniform(self) -> bool:
        return not self.pattern


def layer_names(plan: LayerPlan, n_layers: int) -> list[str]:
    """The type name of each of ``n_layers`` layers ("" for every layer of a uniform model)."""
    if plan.uniform:
        return [""] * n_layers
    return [plan.pattern[i % len(plan.pattern)] for i in range(n_layers)]


def check_plan(plan: LayerPlan, n_layers: int) -> None:
    """What a plan cannot do whatever its layers are: a pattern longer than the model."""
    if len(plan.pattern) > n_layers:
        raise ConfigError(f"model.layers.pattern={plan.pattern!r} has {len(plan.pattern)} layers but the model has "
                          f"model.n_layers={n_layers}: the pattern repeats over the layers, so it can be at most as "
                          "long as the model; shorten it or add layers")
