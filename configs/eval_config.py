"""The ``eval:`` section of a run config: lengths, protocols, scalings and corpora of the
length-extrapolation evaluation (eval/), with the task and diagnostics sections nested in it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from ropelab.common.errors import ConfigError, positive
from ropelab.configs.data_config import DocumentMode
from ropelab.configs.diagnostics import DiagnosticsConfig
from ropelab.configs.tasks import TaskEvalConfig
from ropelab.model.config import SCALING_TYPES, ScalingType
from ropelab.model.encodings import DEFAULT_KIND, KINDS, accepts_rope_scaling

# nonoverlap: windows of the length, every target scored (the ALiBi paper's protocol);
# sliding: windows eval.stride apart, each scoring its last stride targets; same-tokens: the
# same target spans at every length, only the context before them grows (eval/lm/perplexity.py).
Protocol = Literal["nonoverlap", "sliding", "same-tokens"]


@dataclass
class EvalCorpus:
    """A corpus to evaluate on, always tokenized with the evaluated run's own tokenizer.

    ``source: run`` is the run's own data (its ``eval.split``); ``local`` reads ``paths``
    (files, directories or globs); ``hub`` a Hugging Face dataset (``hub``: a preset name
    or repo[:config], ``split``: the dataset's split name); ``builtin`` the built-in
    corpus. ``within_document`` lays windows inside documents only (documents shorter
    than a window are skipped and counted), the way long-context papers evaluate on
    books; otherwise windows run over the split as one stream. ``lengths`` and
    ``protocols`` override the evaluation's for this corpus.
    """

    source: Literal["run", "local", "hub", "builtin"] = "run"
    name: Optional[str] = None  # how reports call it (default: derived from the source)
    paths: list[str] = field(default_factory=list)
    hub: Optional[str] = None
    split: Optional[str] = None  # run/builtin: valid or test (default eval.split); hub: its split name
    documents: Optional[DocumentMode] = None  # default: the run's own; file for local; line otherwise
    within_document: bool = False
    lengths: list[int] = field(default_factory=list)  # empty: the evaluation's lengths
    protocols: list[Protocol] = field(default_factory=list)  # empty: the evaluation's

    def __post_init__(self) -> None:
        if (self.source == "local") != bool(self.paths):
            raise ConfigError("eval corpus: paths go with source=local (files, directories or globs) "
                              f"and only with it (got source={self.source}, paths={self.paths})")
        if (self.source == "hub") != (self.hub is not None):
            raise ConfigError("eval corpus: hub (a dataset name) goes with source=hub and only with it")
        if self.source in ("run", "builtin") and self.split not in (None, "valid", "test"):
            raise ConfigError(f"eval corpus: split must be valid or test for source={self.source} "
                              f"(got {self.split!r})")
        if self.source == "run" and self.documents is not None:
            raise ConfigError("eval corpus: source=run keeps the run's own data.documents; "
                              "use source=local to read the files another way")
        if any(n < 1 for n in self.lengths):
            raise ConfigError(f"eval corpus: lengths must be positive integers (got {self.lengths})")


@dataclass
class EvalConfig:
    """Length-extrapolation evaluation: the one typed config of ``eval/``.

    A run's config carries it (``eval:``); a grid's ``eval:`` section and the flags of
    ``ropelab eval`` override its keys through the same typed loader.
    Lengths: ``lengths`` if given, else ``length_multipliers`` x train.seq_len. The sliding
    protocol's stride defaults to half the evaluated length, so every scored token sees at
    least length/2 tokens of context at twice the cost of non-overlapping windows. Static
    RoPE scalings use factor = length / train.seq_len unless ``factor`` fixes it; dynamic
    NTK adapts to the length itself, so it keeps factor 1 (or ``factor``).
    """

    lengths: list[int] = field(default_factory=list)
    length_multipliers: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0, 4.0, 8.0, 16.0])
    stride: Optional[int] = None
    protocols: list[Protocol] = field(default_factory=lambda: ["nonoverlap"])
    # same-tokens: targets per span (null: the shortest evaluated length, so every length can
    # score them; each length's window ends with the span).
    target_tokens: Optional[int] = None
    scalings: list[ScalingType] = field(default_factory=lambda: ["none"])
    factor: Optional[float] = None  # a fixed RoPE scaling factor instead of length / train.seq_len
    batch_size: int = 8  # windows per forward; never changes a result
    # Tokens scored per length and protocol, in windows spread evenly over the split
    # (100k ≈ 40% of WikiText-2's validation split); null scores the whole split.
    max_tokens: Optional[int] = 100_000
    split: Literal["valid", "test"] = "valid"
    per_position: bool = True  # the mean loss by position at the longest length (from its windows)
    corpora: list[EvalCorpus] = field(default_factory=lambda: [EvalCorpus()])
    # The row the report compares every other row with (paired); left at "rope" where no row
    # is called that, the row the others were fine-tuned from (eval/reporting/reference.py: report_reference).
    reference: str = KINDS[DEFAULT_KIND].label
    # Training steps whose checkpoints to evaluate (a fine-tuning budget curve; they must
    # be kept: train.keep_last); empty: the latest checkpoint only.
    steps: list[int] = field(default_factory=list)
    tasks: TaskEvalConfig = field(default_factory=TaskEvalConfig)  # ropelab tasks
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)  # ropelab diagnose

    def __post_init__(self) -> None:
        positive("eval", self, "batch_size")
        positive("eval", self, "stride", "max_tokens", "target_tokens", allow_none=True)
        if any(n < 1 for n in self.lengths):
            raise ConfigError(f"eval.lengths must be positive integers (got {self.lengths})")
        if any(not m > 0 for m in self.length_multipliers):
            raise ConfigError(f"eval.length_multipliers must be positive (got {self.length_multipliers})")
        if not self.lengths and not self.length_multipliers:
            raise ConfigError("set eval.lengths or eval.length_multipliers (both are empty)")
        if not self.protocols:
            raise ConfigError("eval.protocols must name at least one of nonoverlap, sliding, same-tokens")
        if not self.scalings:
            raise ConfigError("eval.scalings must name at least one scaling (none: plain RoPE)")
        if self.factor is not None and not self.factor >= 1.0:
            raise ConfigError(f"eval.factor must be >= 1 (got {self.factor}); null means length / train.seq_len")
        if not self.corpora:
            raise ConfigError("eval.corpora must name at least one corpus ({source: run} is the run's own)")
        if any(step < 0 for step in self.steps):
            raise ConfigError(f"eval.steps are training steps, 0 or more (got {self.steps})")

    def resolved_lengths(self, train_len: int) -> list[int]:
        """The evaluated lengths, ascending and distinct."""
        if self.lengths:
            return sorted(set(self.lengths))
        return sorted({max(1, round(m * train_len)) for m in self.length_multipliers})

    def resolved_scalings(self, pos_kind: str) -> list[str]:
        """Distinct scalings in SCALING_TYPES order, ``none`` first; only ``none`` for encodings
        that take no RoPE scaling (model/encodings.py)."""
        if not accepts_rope_scaling(pos_kind):
            return ["none"]
        return sorted(set(self.scalings), key=SCALING_TYPES.index)

    def sliding_stride(self, length: int) -> int:
        return self.stride if self.stride is not None else max(1, length // 2)

    def target_span(self, lengths: list[int]) -> tuple[int, int]:
        """(targets per span, the longest length) of the same-token protocol over ``lengths``."""
        target = self.target_tokens if self.target_tokens is not None else min(lengths)
        if target > min(lengths):
            raise ConfigError(f"eval.target_tokens={target} is longer than the shortest evaluated length "
                              f"{min(lengths)}: every length must hold the scored span; lower it or leave it null "
                              "(= the shortest length)")
        return target, max(lengths)
