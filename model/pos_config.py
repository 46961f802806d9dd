"""Positional-encoding configs: which encoding a layer uses and its settings (``model.pos``,
and each layer type's ``pos`` in a layer plan, model/layer_config.py).

Each dataclass validates itself in ``__post_init__``; what is true of each kind (score bias,
trained, limits) is model/encodings.py's table.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field
from typing import Literal, Optional

from ropelab.common.errors import ConfigError
from ropelab.model.encodings import DAPE_BASES, DEFAULT_DAPE_BASE, DEFAULT_KIND, KINDS, POS_KINDS, PosKind, kinds_where

ScalingType = Literal["none", "linear", "ntk", "dynamic", "yarn", "llama3"]
SCALING_TYPES: tuple[str, ...] = typing.get_args(ScalingType)
# xPos scales never exceed 2**XPOS_MAX_LOG2 (nor fall below its inverse): float32 and bf16
# then keep ~2**64 of headroom for q·k, so the served length is fixed (XposConfig.max_len).
XPOS_MAX_LOG2 = 64


@dataclass
class RopeScalingConfig:
    """RoPE context extension (see model/positional/rope_scaling.py for the formulas).

    ``factor`` is the ratio s = target length / ``original_max_len``. ``factor: 1`` (or
    ``type: none``) is plain RoPE for every method except ``dynamic``, which scales by
    length / original_max_len on its own once a sequence is longer (as in transformers).
    """

    type: ScalingType = "none"
    factor: float = 1.0
    original_max_len: Optional[int] = None  # the training length L the model saw
    # YaRN (Peng et al. 2023): ramp between beta_fast and beta_slow rotations.
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: Optional[float] = None  # None: 0.1 * ln(s) + 1
    truncate: bool = True
    # Llama 3.1 frequency-dependent interpolation.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def __post_init__(self) -> None:
        if self.factor < 1.0:
            raise ConfigError(f"pos.rope.scaling.factor must be >= 1 (got {self.factor}); "
                              "use 1 for no scaling")
        if self.type != "none" and self.type != "linear" and self.original_max_len is None:
            raise ConfigError(f"pos.rope.scaling.type={self.type} needs original_max_len "
                              "(the length the model was trained at)")
        if self.original_max_len is not None and self.original_max_len < 1:
            raise ConfigError("pos.rope.scaling.original_max_len must be a positive integer")
        if self.beta_fast <= self.beta_slow:
            raise ConfigError("pos.rope.scaling.beta_fast must be greater than beta_slow")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ConfigError("pos.rope.scaling.high_freq_factor must exceed low_freq_factor")
        if not self.beta_slow > 0 or not self.low_freq_factor > 0:
            raise ConfigError(f"pos.rope.scaling.beta_slow and low_freq_factor must be positive (got "
                              f"{self.beta_slow}, {self.low_freq_factor})")
        if self.attention_factor is not None and not self.attention_factor > 0:
            raise ConfigError(f"pos.rope.scaling.attention_factor must be positive, or null for 0.1·ln(s) + 1 "
                              f"(got {self.attention_factor})")


@dataclass
class RopeConfig:
    """Rotary embeddings (Su et al. 2021) applied to queries and keys."""

    theta: float = 10000.0
    # half: NeoX/LLaMA rotate_half, dim i pairs with i + r/2; interleaved: RoFormer/Meta,
    # dim 2i pairs with 2i+1.
    pairing: Literal["half", "interleaved"] = "half"
    rotary_fraction: float = 1.0  # rotate only the first fraction of each head's dims
    # p-RoPE (Barbero et al. 2024): rotate only the highest fraction of the frequencies,
    # leave the lowest unrotated (frequency 0); 1 is plain RoPE. Unlike rotary_fraction,
    # the kept frequencies are unchanged (θ^(-2i/r) for the i kept).
    frequency_fraction: float = 1.0
    scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)

    def __post_init__(self) -> None:
        if not self.theta > 1.0:
            raise ConfigError(f"pos.rope.theta must be > 1 (got {self.theta})")
        if not 0.0 < self.rotary_fraction <= 1.0:
            raise ConfigError(f"pos.rope.rotary_fraction must be in (0, 1] (got {self.rotary_fraction})")
        if not 0.0 < self.frequency_fraction <= 1.0:
            raise ConfigError(f"pos.rope.frequency_fraction must be in (0, 1] (got {self.frequency_fraction}); "
                              "1 rotates every frequency (plain RoPE), 0.75 drops the lowest quarter")


@dataclass
class T5BiasConfig:
    """T5's relative attention bias (Raffel et al. 2020, §2.1): one learned scalar per head
    and bucket; half the buckets are exact distances, the rest log-spaced up to
    ``max_distance``, beyond which every distance shares the last bucket."""

    num_buckets: int = 32
    max_distance: int = 128

    def __post_init__(self) -> None:
        if self.num_buckets < 2:
            raise ConfigError(f"pos.t5.num_buckets must be at least 2 (got {self.num_buckets}): "
                              "half are exact distances, the rest log-spaced; T5 uses 32")
        if self.max_distance < self.num_buckets:
            raise ConfigError(f"pos.t5.max_distance={self.max_distance} is smaller than pos.t5.num_buckets="
                              f"{self.num_buckets}: the log-spaced buckets need distances beyond the exact "
                              "ones; T5 uses 32 buckets up to 128")


@dataclass
class FireConfig:
    """FIRE (Li et al. 2023): bias f(ψ(i−j) / ψ(max(L, i))), ψ(x) = log(c·x + 1), f an MLP
    to one value per head; c and the threshold L are learned from these initial values."""

    mlp_width: int = 32
    init_c: float = 0.1
    threshold: float = 512.0  # the initial L

    def __post_init__(self) -> None:
        if self.mlp_width < 1:
            raise ConfigError(f"pos.fire.mlp_width must be a positive integer (got {self.mlp_width})")
        if not self.init_c > 0 or not self.threshold > 0:
            raise ConfigError(f"pos.fire.init_c and pos.fire.threshold must be positive "
                              f"(got {self.init_c}, {self.threshold})")


@dataclass
class XposConfig:
    """xPos (Sun et al. 2022): RoPE whose pair i is scaled by ζ_i^(n/scale_base) on the
    query at n and ζ_i^(−m/scale_base) on the key at m, ζ_i = (2i/r + γ)/(1 + γ)."""

    scale_base: float = 512.0
    gamma: float = 0.4

    def __post_init__(self) -> None:
        if not self.scale_base > 0 or not self.gamma > 0:
            raise ConfigError(f"pos.xpos.scale_base and pos.xpos.gamma must be positive "
                              f"(got {self.scale_base}, {self.gamma})")

    @property
    def max_len(self) -> int:
        """Longest sequence served: positions are centred on the sequence (|n − c| ≤ len/2)
        and the largest scale, ζ_0^(−len/2 / scale_base), stays within 2**XPOS_MAX_LOG2."""
        half = math.floor(self.scale_base * XPOS_MAX_LOG2 * math.log(2) / math.log((1 + self.gamma) / self.gamma))
        return 2 * half + 1


@dataclass
class CopeConfig:
    """CoPE (Golovneva et al. 2024): each query counts the keys between itself and key j,
    each weighted by a gate σ(q·k/√d), and that count p (fractional, capped at
    ``max_pos`` − 1) picks an interpolated learned position embedding e[p] per layer,
    added to the score as q·e[p]. The embeddings start at ``init_std`` (0 in the paper's
    code: training starts as NoPE)."""

    max_pos: int = 64
    init_std: float = 0.0

    def __post_init__(self) -> None:
        if self.max_pos < 2:
            raise ConfigError(f"pos.cope.max_pos must be at least 2 (got {self.max_pos}): contextual "
                              "positions run from 0 to max_pos − 1 and are interpolated between "
                              "neighbouring embeddings")
        if not self.init_std >= 0 or self.init_std == float("inf"):
            raise ConfigError(f"pos.cope.init_std must be a finite number >= 0 (got {self.init_std})")


DapeBase = Literal[DAPE_BASES]  # type: ignore[valid-type]  # the distance-table biases


@dataclass
class DapeConfig:
    """DAPE (Zheng et al. 2024): a base bias (``base``, a distance-table bias) plus an MLP of
    width ``mlp_width`` over each pair's logits and bias across the heads
    (model/positional/dape.py); KERPLE and 32 are the paper's headline choice."""

    base: DapeBase = DEFAULT_DAPE_BASE
    mlp_width: int = 32

    def __post_init__(self) -> None:
        if self.base not in DAPE_BASES:
            raise ConfigError(f"pos.dape.base={self.base!r} is not a bias DAPE builds on; choose one of "
                              f"{', '.join(DAPE_BASES)}")
        if self.mlp_width < 1:
            raise ConfigError(f"pos.dape.mlp_width must be a positive integer (got {self.mlp_width})")


@dataclass
class PosConfig:
    """Which positional encoding the model uses; one key, ``kind``, picks it."""

    kind: PosKind = DEFAULT_KIND
    max_len: Optional[int] = None  # the size of a learned table (required for one; model/encodings.py)
    rope: RopeConfig = field(default_factory=RopeConfig)  # rope and xpos
    t5: T5BiasConfig = field(default_factory=T5BiasConfig)
    fire: FireConfig = field(default_factory=FireConfig)
    xpos: XposConfig = field(default_factory=XposConfig)
    cope: CopeConfig = field(default_factory=CopeConfig)
    dape: DapeConfig = field(default_factory=DapeConfig)
    # Additive absolute encodings: the factor on the token embeddings before the encoding
    # is added. null: the encoding's own (√d_model for sinusoidal, Vaswani et al. §3.4;
    # 1 for learned). An ablation knob: token and position parts start at RMS 0.02·scale
    # and 1/√2 (sinusoid) or 0.02 (learned table).
    token_scale: Optional[float] = None

    def __post_init__(self) -> None:
        # The loader checks the Literal for YAML; this also covers configs built in Python.
        if self.kind not in KINDS:
            raise ConfigError(f"pos.kind={self.kind!r} is not a positional encoding; choose one of "
                              f"{', '.join(POS_KINDS)}")
        row = KINDS[self.kind]
        if row.sized_by_max_len and (self.max_len is None or self.max_len < 1):
            raise ConfigError(f"pos.kind={self.kind} needs pos.max_len (the number of positions "
                              "in the table, at least the training seq_len)")
        if self.max_len is not None and self.max_len < 1:
            raise ConfigError(f"pos.max_len must be a positive integer or null (got {self.max_len})")
        if self.token_scale is not None:
            if not row.additive:
                raise ConfigError(f"pos.token_scale scales token embeddings before an absolute encoding is "
                                  f"added; pos.kind={self.kind} adds none (use "
                                  f"{' or '.join(kinds_where('additive'))}, or null)")
            if not self.token_scale > 0 or self.token_scale == float("inf"):
                raise ConfigError(f"pos.token_scale must be a positive number (got {self.token_scale})")
