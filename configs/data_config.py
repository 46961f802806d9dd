"""The ``data:`` section of a run config: where the text comes from, its documents and its tokenizer.

``DataConfig`` nests the Hub, local-file and tokenizer sections, and the synthetic-task and
mix sections of configs/tasks.py. Relative paths (``data.local.*``, ``data.cache_dir``)
resolve against the current working directory (configs/schema.py's docstring says why).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Literal, Optional

from ropelab.common.errors import ConfigError, positive
from ropelab.configs.tasks import MixConfig, SyntheticConfig

# Named Hub datasets: (repo, config, text field, train, validation, test split names).
HUB_PRESETS: dict[str, tuple[str, Optional[str], str, str, str, Optional[str]]] = {
    "wikitext-2-raw-v1":
        ("Salesforce/wikitext", "wikitext-2-raw-v1", "text", "train", "validation", "test"),
    "wikitext-103-raw-v1":
        ("Salesforce/wikitext", "wikitext-103-raw-v1", "text", "train", "validation", "test"),
    "tinystories": ("roneneldan/TinyStories", None, "text", "train", "validation", None),
}

# What one document is (data.documents, and an evaluation corpus's documents).
DocumentMode = Literal["line", "paragraph", "file", "wikitext"]


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
        positive("data.tokenizer", self, "min_frequency")
        positive("data.tokenizer", self, "max_train_chars", allow_none=True)
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
        positive("data", self, "num_proc", allow_none=True)
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
                              "ropelab tasks")
