"""The typed run configuration: one tree of dataclasses, each validating itself.

``RunConfig{name, out_dir, model, data, train, eval, log}``. ``model`` is
``model.config.ModelConfig`` (architecture only). YAML turns into these objects through
``configs/loader.py``, which checks keys and types and names the file on error; the checks
here are about values (ranges, combinations) and run in ``__post_init__`` so that an
impossible config fails before any work starts.

Vocabulary size: the tokenizer owns it. Presets do not set ``model.vocab_size``; the
trainer prepares the data, then calls ``cfg.with_vocab_size(tokenizer.vocab_size)``
before building the model and saves *that* config into the run directory, so the saved
config rebuilds the model exactly. To change the vocabulary, set
``data.tokenizer.vocab_size`` (bpe) or ``data.tokenizer.kind``.

Relative data paths (``data.local.*``, ``data.cache_dir``) resolve against the current
working directory, like any command-line path; presets are written to be run from the
repository root.
"""

from __future__ import annotations

import codecs
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from common.devices import check_device_name
from configs.diagnostics import DiagnosticsConfig
from configs.tasks import MixConfig, SyntheticConfig, TaskEvalConfig
from model.config import SCALING_TYPES, ModelConfig, ScalingType
from model.encodings import DEFAULT_KIND, KINDS, accepts_rope_scaling, kinds_where, served_length
from common.errors import ConfigError

# Named Hub datasets: (repo, config, text field, train, validation, test split names).
HUB_PRESETS: dict[str, tuple[str, Optional[str], str, str, str, Optional[str]]] = {
    "wikitext-2-raw-v1":
        ("Salesforce/wikitext", "wikitext-2-raw-v1", "text", "train", "validation", "test"),
    "wikitext-103-raw-v1":
        ("Salesforce/wikitext", "wikitext-103-raw-v1", "text", "train", "validation", "test"),
    "tinystories": ("roneneldan/TinyStories", None, "text", "train", "validation", None),
}


def _positive(section: str, obj: object, *names: str, allow_none: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None and allow_none:
            continue
        if value is None or value < 1:
            raise ConfigError(f"{section}.{name} must be a positive integer (got {value!r})")


@dataclass
class TokenizerConfig:
    """How text becomes token ids; trained (bpe) or built (char) on the training split, or
    read from a saved file (``kind: file``)."""

    kind: Literal["bpe", "byte", "char", "file"] = "bpe"
    vocab_size: int = 2048  # bpe only: merges + 256 byte symbols + <|endoftext|>
    # file only: a tokenizer.json (ropelab's, or any Hugging Face tokenizers file) used as
    # is. Relative to the working directory; for a run's own config (e.g. an imported
    # transformers model) evaluation reads the run directory's tokenizer.json instead.
    path: Optional[str] = None
    min_frequency: int = 2  # bpe only: a pair must occur this often to be merged
    # bpe only: train on at most this many characters of the training split (None: all);
    # WikiText-103-sized corpora train a good tokenizer from a prefix in a fraction of the time.
    max_train_chars: Optional[int] = None

    def __post_init__(self) -> None:
        _positive("data.tokenizer", self, "min_frequency")
        _positive("data.tokenizer", self, "max_train_chars", allow_none=True)
        if (self.kind == "file") != (self.path is not None):
            raise ConfigError("data.tokenizer.path goes with data.tokenizer.kind=file (a saved "
                              "tokenizer.json to use as is): set both, or neither"
                              f" (got kind={self.kind}, path={self.path!r})")
        if self.kind == "bpe" and self.vocab_size < 258:
            raise ConfigError(f"data.tokenizer.vocab_size={self.vocab_size} is too small for "
                              "byte-level BPE: it needs 256 byte symbols + <|endoftext|> + merges")


@dataclass
class HubConfig:
    """A Hugging Face Hub dataset: a preset name (see HUB_PRESETS) or ``repo[:config]``.

    Fields left null take the preset's value (or text/train/validation, no test split, for
    other repos); they are filled in here so the saved config says what was used.
    """

    name: str = "wikitext-2-raw-v1"
    text_field: Optional[str] = None
    train_split: Optional[str] = None
    valid_split: Optional[str] = None
    test_split: Optional[str] = None
    revision: Optional[str] = None  # a git revision of the dataset repo, for reproducibility
    streaming: bool = False  # True: never download the whole corpus (iterate it remotely)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("data.hub.name must name a dataset, e.g. wikitext-2-raw-v1 or "
                              "roneneldan/TinyStories")
        preset = HUB_PRESETS.get(self.name, (None, None, "text", "train", "validation", None))
        for i, key in enumerate(("text_field", "train_split", "valid_split", "test_split"), 2):
            if getattr(self, key) is None:
                setattr(self, key, preset[i])

    @property
    def repo_and_config(self) -> tuple[str, Optional[str]]:
        if self.name in HUB_PRESETS:
            return HUB_PRESETS[self.name][0], HUB_PRESETS[self.name][1]
        repo, _, config = self.name.partition(":")
        return repo, (config or None)


@dataclass
class LocalConfig:
    """Local text: each entry is a file, a directory (all files in it) or a glob.

    Without ``valid`` files, ``valid_fraction`` of the training documents become the
    validation split (likewise ``test``); ``split_mode`` random picks them with
    ``split_seed``, tail takes the last documents. ``characters`` cuts the training text
    itself instead, at character fractions (train | valid | test, in file order), so a
    single file splits as nanoGPT splits Tiny Shakespeare: the first int(0.9·n) characters
    train, the rest validate (``valid_fraction: 0.1``); each part is then cut into
    documents as ``data.documents`` says.
    """

    train: list[str] = field(default_factory=list)
    valid: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)
    valid_fraction: float = 0.0
    test_fraction: float = 0.0
    split_mode: Literal["random", "tail", "characters"] = "random"
    split_seed: int = 0

    def __post_init__(self) -> None:
        for key in ("valid_fraction", "test_fraction"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"data.local.{key} must be in [0, 1) (got {getattr(self, key)})")
        if self.split_seed < 0:
            raise ConfigError(f"data.local.split_seed must be 0 or more (got {self.split_seed})")
        carved = (0.0 if self.valid else self.valid_fraction) + (0.0 if self.test else self.test_fraction)
        if carved >= 1.0:
            raise ConfigError("data.local.valid_fraction + test_fraction must leave some "
                              f"text for training (their sum is {carved:g}; it must be below 1)")


@dataclass
class DataConfig:
    """Where the text comes from, how it splits into documents, and the tokenizer.

    ``source: synthetic`` trains on a task made on the fly (``synthetic``, configs/tasks.py)
    instead of text; its tokenizer is the tasks' alphabet, one character per token. A text
    run may mix retrieval instances into its batches (``mix``, with ``synthetic``'s parameters).
    """

    source: Literal["builtin", "hub", "local", "synthetic"] = "builtin"
    hub: HubConfig = field(default_factory=HubConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    mix: MixConfig = field(default_factory=MixConfig)  # retrieval instances in a text run's batches
    # What one document is (each ends with <|endoftext|>): line = each line / dataset row;
    # paragraph = blocks separated by blank lines (local only); file = a whole file (local
    # only); wikitext = lines grouped into articles, a new one at each ` = Title = ` line.
    documents: DocumentMode = "line"
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    cache_dir: Optional[str] = None  # None: $ROPELAB_CACHE or .cache/ropelab/data
    num_proc: Optional[int] = None  # tokenizer processes; None: min(2, cpu count)
    # The text encoding of local files (any Python codec name, e.g. latin-1, cp1252, utf-16).
    encoding: str = "utf-8"

    def __post_init__(self) -> None:
        _positive("data", self, "num_proc", allow_none=True)
        try:
            codecs.lookup(self.encoding)
        except LookupError:
            raise ConfigError(f"data.encoding={self.encoding!r} is not a text encoding Python knows; use "
                              "e.g. utf-8, latin-1, cp1252 or utf-16") from None
        if self.source == "local":
            if not self.local.train:
                raise ConfigError("data.source=local needs data.local.train (files, directories "
                                  "or globs), e.g. data.local.train=[corpus/train.txt]")
            if not self.local.valid and self.local.valid_fraction == 0.0:
                raise ConfigError("data.source=local needs a validation split: set "
                                  "data.local.valid (files) or data.local.valid_fraction (e.g. 0.05)")
        if self.documents in ("paragraph", "file") and self.source != "local":
            raise ConfigError(f"data.documents={self.documents} only applies to data.source=local; "
                              "use line or wikitext")
        if self.source == "synthetic" and self.mix.tasks:
            raise ConfigError("data.mix mixes task instances into a text run's batches; a synthetic run trains on "
                              "data.synthetic.tasks alone: remove data.mix")
        if self.source == "synthetic" and self.tokenizer.kind != "char":
            raise ConfigError("data.source=synthetic writes every task in one alphabet, one character "
                              f"per token: set data.tokenizer.kind=char (got {self.tokenizer.kind}). A "
                              "synthetic run has no corpus to score perplexity on: score it with "
                              "python -m eval.tasks")


@dataclass
class RandomPositionsConfig:
    """Randomized positions (Ruoss et al. 2023, ACL): each training sequence of seq_len
    tokens gets a sorted random subset of [0, max_len) as its positions instead of
    0 … seq_len−1, so the positions of longer evaluation windows were all seen in
    training. Evaluation and generation use 0 … T−1. Draws are a pure function of
    (train.seed, batch index), like the training windows (data/samplers.py)."""

    max_len: int = 1024

    def __post_init__(self) -> None:
        _positive("train.random_positions", self, "max_len")


@dataclass
class TrainConfig:
    """The optimisation run. Exactly one of max_steps / max_tokens sets its length."""

    seq_len: int = 128
    batch_size: int = 16  # micro-batch per rank
    grad_accum: int = 1
    # Exactly one is set; to budget by tokens write max_steps: null, max_tokens: N.
    max_steps: Optional[int] = 1000
    max_tokens: Optional[int] = None  # total tokens over all ranks and micro-batches
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decay floor, as a fraction of lr
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    seed: int = 1337
    device: str = "auto"  # auto, cpu, cuda, cuda:N or mps (common/devices.py)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # torch.compile the model: true, false, or auto (training/probe.py decides from timed steps
    # of this shape whether the compile time pays back over the run's remaining steps).
    compile: Union[bool, Literal["auto"]] = False
    eval_interval: int = 200
    eval_batches: int = 20
    ckpt_interval: int = 200
    keep_last: int = 2
    resume: Literal["never", "auto"] = "never"
    log_interval: int = 10
    # null: positions 0 … seq_len−1; {max_len: N}: randomized positions from [0, N)
    random_positions: Optional[RandomPositionsConfig] = None
    # The positional encoding's own parameters train at lr × this (training/optim.py); only
    # for encodings that have some (``trained`` in model/encodings.py).
    pos_lr_multiplier: float = 1.0
    # Synthetic runs (and text runs with data.mix, on their mixed tasks): stop once the
    # exact-match accuracy at seq_len on a fixed set of eval_batches x batch_size instances per
    # task (checked every eval_interval steps) reaches this for every task; max_steps is then
    # the budget (training/competence.py). null: no stop.
    stop_at_accuracy: Optional[float] = None

    def __post_init__(self) -> None:
        _positive("train", self, "seq_len", "batch_size", "grad_accum", "eval_interval",
                  "eval_batches", "ckpt_interval", "keep_last", "log_interval")
        _positive("train", self, "max_steps", "max_tokens", allow_none=True)
        check_device_name(self.device, "train.device")
        if self.seed < 0:  # numpy's generators (samplers, tasks) take non-negative seeds only
            raise ConfigError(f"train.seed must be 0 or more (got {self.seed})")
        if (self.max_steps is None) == (self.max_tokens is None):
            raise ConfigError("set exactly one of train.max_steps and train.max_tokens "
                              f"(got max_steps={self.max_steps}, max_tokens={self.max_tokens}); "
                              "set the other to null")
        if not self.lr > 0:
            raise ConfigError(f"train.lr must be positive (got {self.lr})")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"train.min_lr_ratio must be in [0, 1] (got {self.min_lr_ratio})")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError("train.warmup_steps, weight_decay and grad_clip must be >= 0")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"train.{key} must be in [0, 1) (got {getattr(self, key)})")
        if not self.pos_lr_multiplier > 0:
            raise ConfigError(f"train.pos_lr_multiplier must be positive (got "
                              f"{self.pos_lr_multiplier}); 1 trains the positional parameters at train.lr")
        if self.stop_at_accuracy is not None and not 0.0 < self.stop_at_accuracy <= 1.0:
            raise ConfigError(f"train.stop_at_accuracy must be in (0, 1], an exact-match accuracy, or null "
                              f"(got {self.stop_at_accuracy})")

    def tokens_per_step(self, world_size: int = 1) -> int:
        return self.batch_size * self.grad_accum * self.seq_len * world_size

    def total_steps(self, world_size: int = 1) -> int:
        """Optimizer steps in the run (max_tokens rounds up to whole steps)."""
        if self.max_steps is not None:
            return self.max_steps
        return math.ceil(self.max_tokens / self.tokens_per_step(world_size))


DocumentMode = Literal["line", "paragraph", "file", "wikitext"]
# nonoverlap: windows of the length, every target scored (the ALiBi paper's protocol);
# sliding: windows eval.stride apart, each scoring its last stride targets; same-tokens: the
# same target spans at every length, only the context before them grows (eval/perplexity.py).
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
    ``python -m eval.extrapolation`` override its keys through the same typed loader.
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
    # is called that, the row the others were fine-tuned from (eval/report.py: report_reference).
    reference: str = KINDS[DEFAULT_KIND].label
    # Training steps whose checkpoints to evaluate (a fine-tuning budget curve; they must
    # be kept: train.keep_last); empty: the latest checkpoint only.
    steps: list[int] = field(default_factory=list)
    tasks: TaskEvalConfig = field(default_factory=TaskEvalConfig)  # python -m eval.tasks
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)  # scripts/diagnose.py

    def __post_init__(self) -> None:
        _positive("eval", self, "batch_size")
        _positive("eval", self, "stride", "max_tokens", "target_tokens", allow_none=True)
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


@dataclass
class InitConfig:
    """Start from a trained run (fine-tuning, context extension).

    Weights only: the new run has its own optimizer, schedule, ``train.seq_len`` and RoPE
    scaling (``model.pos.rope.scaling``, active in training and then part of the new
    run's model). The architecture must be the parent's, apart from the scaling. The new
    run records its parent in its checkpoints and saves the starting weights as step 0.
    """

    run: Optional[str] = None  # the parent run directory
    which: Literal["latest", "best"] = "latest"
    # The checkpoint of this training step instead of ``which``; the parent need not have
    # finished (e.g. carrying on from a diverged run's last good step: training/divergence.py).
    step: Optional[int] = None

    def __post_init__(self) -> None:
        if self.step is not None and self.step < 0:
            raise ConfigError(f"init.step is a training step of the parent, 0 or more (got {self.step})")
        if self.step is not None and self.which == "best":
            raise ConfigError(f"init.step={self.step} and init.which=best both choose the parent's checkpoint; "
                              "give one of them")
        if self.run is None and (self.step is not None or self.which != "latest"):
            raise ConfigError("init.step and init.which choose a checkpoint of init.run; set init.run (the parent "
                              "run directory) too, or remove them")


@dataclass
class LogConfig:
    """Where metrics go besides metrics.jsonl in the run directory."""

    wandb: bool = False
    wandb_project: str = "ropelab"
    wandb_entity: Optional[str] = None
    wandb_mode: Literal["online", "offline"] = "online"
    # A tqdm bar on a terminal; with false, or when output goes to a file, one line per
    # train.log_interval steps and per validation instead.
    progress: bool = True


@dataclass
class RunConfig:
    """Everything a run needs; written into the run directory as config.yaml."""

    name: str = "run"
    out_dir: str = "runs"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    init: InitConfig = field(default_factory=InitConfig)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or "\\" in self.name:
            raise ConfigError(f"name must be a non-empty run name without slashes (got {self.name!r})")
        pos = self.model.pos
        self._check_served("train.seq_len", self.train.seq_len, "is shorter than")
        if self.train.random_positions is not None:
            self._check_random_positions(self.train.random_positions.max_len)
        mix = self.data.mix
        if mix.tasks and not 1 <= round(mix.fraction * self.train.batch_size) < self.train.batch_size:
            raise ConfigError(f"data.mix.fraction={mix.fraction} of train.batch_size={self.train.batch_size} rows is "
                              f"{round(mix.fraction * self.train.batch_size)} task rows per batch; it must leave at "
                              "least one task row and one text row: change the fraction or the batch size")
        if self.train.stop_at_accuracy is not None and self.data.source != "synthetic" and not mix.tasks:
            raise ConfigError(f"train.stop_at_accuracy={self.train.stop_at_accuracy} needs tasks to score: a "
                              "synthetic run (data.source=synthetic) or a text run that mixes tasks in (data.mix); "
                              "it stops on the tasks' exact-match accuracy at train.seq_len. Remove it for a run "
                              "trained on text alone")
        if self.train.pos_lr_multiplier != 1.0 and not KINDS[pos.kind].trained:
            raise ConfigError(f"train.pos_lr_multiplier={self.train.pos_lr_multiplier} has nothing to act on: "
                              f"model.pos.kind={pos.kind} has no learned parameters (those that do: "
                              f"{', '.join(sorted(kinds_where('trained')))}); remove it or set it to 1")

    def _check_served(self, key: str, positions: int, relation: str) -> None:
        """Refuse training positions 0 … ``positions``−1 that the encoding cannot serve."""
        pos, limit = self.model.pos, served_length(self.model.pos)
        if limit is not None and limit < positions:
            row = KINDS[pos.kind]
            raise ConfigError(f"model.pos.{row.limit.key}={limit} {relation} {key}={positions}: {key} exceeds "
                              f"the {limit} positions pos.kind={pos.kind} serves ({row.limit.why}); "
                              f"{row.limit.fix}, or lower {key}")

    def _check_random_positions(self, max_len: int) -> None:
        pos, seq_len = self.model.pos, self.train.seq_len
        if max_len < seq_len:
            raise ConfigError(f"train.random_positions.max_len={max_len} is smaller than train.seq_len="
                              f"{seq_len}: each sequence needs {seq_len} distinct positions from "
                              f"[0, max_len); use a max_len of at least {seq_len} (typically the longest "
                              "evaluation length)")
        if not KINDS[pos.kind].takes_positions:
            raise ConfigError(f"train.random_positions has no effect with model.pos.kind={pos.kind} "
                              f"({KINDS[pos.kind].no_positions}: it takes no position indices); remove it or "
                              f"choose an encoding that takes positions ({', '.join(kinds_where('takes_positions'))})")
        self._check_served("train.random_positions.max_len", max_len, "is smaller than")

    def with_vocab_size(self, vocab_size: int) -> RunConfig:
        """This config with model.vocab_size set from the tokenizer (see module docstring)."""
        return dataclasses.replace(self, model=dataclasses.replace(self.model, vocab_size=vocab_size))
