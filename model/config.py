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

import math
import typing
from dataclasses import dataclass, field
from typing import Literal, Optional

from ropelab.common.errors import ConfigError
from ropelab.model.encodings import DEFAULT_KIND, KINDS, POS_KINDS, PosKind, kinds_where

ScalingType = Literal["none", "linear", "ntk", "dynamic", "yarn", "llama3"]
AttentionKind = Literal["softmax", "linear"]
FeatureMap = Literal["elu", "relu"]
# The one list of each, for every CLI, the benchmark and the tests (the encodings' list,
# POS_KINDS, and what each encoding is and allows are in model/encodings.py).
SCALING_TYPES: tuple[str, ...] = typing.get_args(ScalingType)
ATTENTION_KINDS: tuple[str, ...] = typing.get_args(AttentionKind)
FEATURE_MAPS: tuple[str, ...] = typing.get_args(FeatureMap)
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
        row = KINDS[self.pos.kind]
        if row.rotary:
            self._check_rotary()
        if not row.rope_scaling and self.pos.rope.scaling.type != "none":
            raise ConfigError(f"pos.rope.scaling.type={self.pos.rope.scaling.type} scales RoPE's frequencies, but "
                              f"pos.kind={self.pos.kind} has none; use pos.kind="
                              f"{' or '.join(kinds_where('rope_scaling'))}, or scaling type none")
        if row.pairs_d_model and self.d_model % 2:
            raise ConfigError(f"pos.kind={self.pos.kind} needs an even d_model (sin/cos pairs)")
        self._check_attention()

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
                f"pos.kind={self.pos.kind} adds a bias to the attention scores, but linear attention "
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
