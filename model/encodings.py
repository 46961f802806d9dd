"""What is true of each positional encoding: one row per ``model.pos.kind``, the table every
check asks.

The classes that compute the encodings are in ``model/positional/`` (its registry maps a
kind to its class, and tests/unit/test_positional.py checks that each row agrees with its
class). Whatever else needs to know something about a kind (the config's checks, the
loader, evaluation, the Llama export, the benchmark) asks this table, never the kind's
name, so adding an encoding is its module, its row here and its preset
``configs/pe/<label>.yaml`` (tests/integration/test_encodings.py keeps kind names out of other code).

This module imports nothing of the project and not torch, so configs and command lines can
read it without loading a network (tests/integration/test_encodings.py checks that too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional


@dataclass(frozen=True)
class Limit:
    """A finite number of positions an encoding serves, and where the config sets it."""

    key: str  # the PosConfig attribute holding it, dotted ("max_len", "xpos.max_len")
    what: str  # "pos.kind=K {what}", with {n} the number of positions
    why: str  # why no more positions can be served
    fix: str  # how to serve more


@dataclass(frozen=True)
class Encoding:
    """One row of the table: what a positional encoding does and what it allows."""

    name: str  # as prose names it
    label: str  # as report rows and its preset file (configs/pe/<label>.yaml) name it
    # Adds a bias that depends on positions only to the attention scores (the class's
    # ``has_bias``): attention must form the score matrix.
    score_bias: bool = False
    # Adds a bias that depends on the content too (q and k of each layer; the class's
    # ``contextual``): attention forms the logits and hands them over.
    contextual: bool = False
    # Adds a data-dependent decay from each layer's input (the class's ``decays``): the
    # running sums of log forget gates between key and query, kept in the KV cache.
    decay: bool = False
    # Its bias depends on the distance alone, one (H, n) table per forward (the class is a
    # TableBias, model/positional/distance.py): a base DAPE can build on.
    table_bias: bool = False
    trained: bool = False  # has trained parameters of its own, under the model's ``pos.``
    rotary: bool = False  # rotates q and k and reads ``pos.rope`` (theta, pairing, fractions)
    # Accepts ``pos.rope.scaling`` (context extension), in training and at evaluation.
    # xPos does: its rotation is RoPE's, built from the scaled frequencies, and its decay
    # ζ^((n−m)/scale_base) depends on neither the frequencies nor the scaling; dynamic NTK
    # fits both the frequencies and xPos's centre to the same fit_len, so a KV cache stays
    # consistent (tests/unit/test_generation.py, tests/integration/test_xpos.py).
    rope_scaling: bool = False
    # Why it takes no position indices (NoPE, CoPE), so randomized positions cannot act;
    # None: it reads them.
    no_positions: Optional[str] = None
    # Added to the (scaled) token embeddings at the input, so ``pos.token_scale`` applies.
    additive: bool = False
    # Pairs dimensions of d_model (sin/cos), so d_model must be even.
    pairs_d_model: bool = False
    limit: Optional[Limit] = None  # None: any length
    # Why transformers' Llama cannot express it; None: it can be exported.
    not_llama: Optional[str] = None
    color: str = "#000000"  # its colour in every figure of the project (eval/lm/plots.py: encoding_color)

    @property
    def takes_positions(self) -> bool:
        return self.no_positions is None

    @property
    def forms_scores(self) -> bool:
        """Whether attention must form the score matrix (so linear attention cannot serve it)."""
        return self.score_bias or self.contextual or self.decay

    @property
    def sized_by_max_len(self) -> bool:
        """Whether ``pos.max_len`` sets how many positions it has (a learned table)."""
        return self.limit is not None and self.limit.key == "max_len"

    @property
    def exportable(self) -> bool:
        return self.not_llama is None


_BIAS = "to the attention scores"
LEARNED_TABLE = Limit(key="max_len", what="has a table of {n} positions",
                      why="learned positions cannot extrapolate",
                      fix="raise model.pos.max_len, or set it to null (the positions training uses)")
XPOS_RANGE = Limit(key="xpos.max_len", what="serves at most {n} positions",
                   why="beyond that its key scales leave the float range, see model/positional/xpos.py",
                   fix="raise model.pos.xpos.scale_base")

KINDS: dict[str, Encoding] = {
    "rope": Encoding("RoPE", "rope", rotary=True, rope_scaling=True, color="#1f77b4"),
    "sinusoidal": Encoding(
        "sinusoidal positions", "sinusoidal", additive=True, pairs_d_model=True,
        not_llama="sinusoidal positions are added to the (√d_model-scaled) token embeddings", color="#2ca02c"),
    "learned": Encoding("learned absolute positions", "learned", trained=True, additive=True, limit=LEARNED_TABLE,
                        not_llama="a learned position table is added to the token embeddings", color="#bcbd22"),
    "alibi": Encoding("ALiBi", "alibi", score_bias=True, table_bias=True,
                      not_llama=f"ALiBi adds a per-head linear distance bias {_BIAS}", color="#d62728"),
    "none": Encoding("NoPE", "nope", no_positions="NoPE has no positional encoding",
                     not_llama="NoPE has no positional encoding, while Llama always rotates q and k", color="#7f7f7f"),
    "t5": Encoding("T5's bias", "t5", score_bias=True, trained=True, table_bias=True,
                   not_llama=f"T5's bias adds a learned per-head, per-distance-bucket bias {_BIAS}", color="#ff7f0e"),
    "kerple": Encoding("KERPLE", "kerple", score_bias=True, trained=True, table_bias=True,
                       not_llama=f"KERPLE adds a learned per-head logarithmic distance bias {_BIAS}", color="#8c564b"),
    "fire": Encoding("FIRE", "fire", score_bias=True, trained=True, table_bias=True,
                     not_llama=f"FIRE adds a bias computed by a learned MLP of the distance {_BIAS}", color="#e377c2"),
    "xpos": Encoding("xPos", "xpos", rotary=True, rope_scaling=True, limit=XPOS_RANGE,
                     not_llama="xPos scales queries and keys by a position-dependent decay on top of the rotation", color="#17becf"),
    "cope": Encoding("CoPE", "cope", contextual=True, trained=True,
                     no_positions="CoPE counts positions from the content",
                     not_llama="CoPE adds a bias computed from gated counts of q·k, with learned per-layer position "
                               f"embeddings, {_BIAS}", color="#9467bd"),
    "fox": Encoding("FoX (forget gate)", "fox", decay=True, trained=True,
                    no_positions="FoX decays by forget gates computed from the content",
                    not_llama=f"FoX adds the sums of learned, data-dependent log forget gates {_BIAS}",
                    color="#393b79"),
    "dape": Encoding("DAPE", "dape", score_bias=True, contextual=True, trained=True,
                     not_llama=f"DAPE adds a base bias and an MLP of the logits and that bias {_BIAS}",
                     color="#637939"),
}

# The one list of kinds, for the config's Literal (the loader checks values against it),
# every CLI, the benchmark and the tests.
POS_KINDS: tuple[str, ...] = tuple(KINDS)
PosKind = Literal[POS_KINDS]  # type: ignore[valid-type]  # Literal["rope", "sinusoidal", …]
# The default encoding, and the row others are compared with (eval.reference, the benchmark).
DEFAULT_KIND = "rope"
# The bases DAPE builds on (distance-table biases) and the paper's headline one, DAPE-KERPLE.
DAPE_BASES: tuple[str, ...] = tuple(kind for kind, row in KINDS.items() if row.table_bias)
DEFAULT_DAPE_BASE = "kerple"
# The kind transformers' Llama computes: the one row it can express.
(LLAMA_KIND,) = (kind for kind, row in KINDS.items() if row.exportable)


def kinds_where(flag: str) -> tuple[str, ...]:
    """The kinds whose row has ``flag`` (a field or property of Encoding) true, in table order."""
    return tuple(kind for kind, row in KINDS.items() if getattr(row, flag))


def accepts_rope_scaling(kind: str) -> bool:
    return KINDS[kind].rope_scaling


def served_length(pos) -> Optional[int]:
    """The positions a PosConfig's encoding serves, 0 … n−1; None where any length is served."""
    limit = KINDS[pos.kind].limit
    if limit is None:
        return None
    value = pos
    for part in limit.key.split("."):
        value = getattr(value, part)
    return value


def report_label(kind: str) -> str:
    """How report rows name an encoding (``nope`` for none); an unknown name stays as it is."""
    row = KINDS.get(kind)
    return row.label if row is not None else kind


def sized_by_max_len(kind: object) -> bool:
    """Whether ``pos.max_len`` sizes this kind's table; False for anything not a kind (the
    loader asks before the kind itself is checked)."""
    return isinstance(kind, str) and kind in KINDS and KINDS[kind].sized_by_max_len
