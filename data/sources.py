"""Where text comes from: the Hugging Face Hub, local files, or the built-in corpus.

Each source is a ``Corpus``: split names (train, valid, optionally test), an iterator of
documents per split, and an ``identity`` (what determines its text, for the cache key).
Hub and local text both go through Hugging Face ``datasets`` (local files with its
``text`` builder, streamed, so a corpus is never loaded into memory whole).
"""

from __future__ import annotations

import codecs
import glob
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np

from ropelab.configs.schema import DataConfig, HubConfig
from ropelab.data.builtin import builtin_documents, builtin_identity, split_of
from ropelab.common.errors import DataError

SPLITS = ("train", "valid", "test")


def _is_wikitext_title(line: str) -> bool:
    # Articles start with " = Title = "; sections are " = = Section = = " and deeper.
    s = line.strip()
    return s.startswith("= ") and s.endswith(" =") and not s.startswith("= =")


def _wikitext_articles(rows: Iterable[str]) -> Iterator[str]:
    """Lines -> articles. A title has a blank line before and after it, which tells it
    apart from table legends like " = Played , W = " inside articles (WikiText-2 then
    has exactly 600 / 60 / 60 articles). Blank lines are dropped, the rest joined by "\n"."""
    lines = (row.rstrip("\n") for row in rows)
    article: list[str] = []
    prev_blank, line = True, next(lines, None)
    while line is not None:
        following = next(lines, None)
        next_blank = following is None or not following.strip()
        if article and prev_blank and next_blank and _is_wikitext_title(line):
            yield "\n".join(article)
            article = []
        if line.strip():
            article.append(line)
        prev_blank, line = not line.strip(), following
    if article:
        yield "\n".join(article)


def group_documents(rows: Iterable[str], mode: str) -> Iterator[str]:
    """Records (lines, paragraphs, files or dataset rows) -> documents, blank ones dropped.

    ``wikitext`` groups lines into articles; every other mode yields each record as a
    document (without its trailing newline).
    """
    if mode == "wikitext":
        return _wikitext_articles(rows)
    return (row.rstrip("\n") for row in rows if row.strip())


class Corpus:
    """Documents per split; subclasses define ``splits``, ``_records`` and ``identity``."""

    splits: tuple[str, ...]

    def __init__(self, cfg: DataConfig):
        self.cfg = cfg

    def documents(self, split: str) -> Iterator[str]:
        if split not in self.splits:
            raise DataError(f"this corpus has no {split!r} split (it has {', '.join(self.splits)})")
        return group_documents(self._records(split), self.cfg.documents)

    def _records(self, split: str) -> Iterator[str]:
        raise NotImplementedError

    def identity(self) -> dict:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


class BuiltinCorpus(Corpus):
    """Python's own documentation (see data/builtin.py); split by a hash of each title."""

    splits = SPLITS

    def _records(self, split: str) -> Iterator[str]:
        return (text for title, text in builtin_documents() if split_of(title) == split)

    def identity(self) -> dict:
        return builtin_identity()

    def describe(self) -> str:
        return "built-in: Python's documentation (pydoc topics + standard-library docstrings)"


def _hub_help(cfg: HubConfig) -> str:
    return ("To use local text files instead, set data.source=local and the files per split, e.g.\n"
            "  data.source=local data.local.train=[path/to/train.txt] "
            "data.local.valid=[path/to/valid.txt] data.local.test=[path/to/test.txt]\n"
            "(or data.local.valid_fraction=0.05 instead of valid files); "
            "configs/wikitext2-cpu-local.yaml does this for ../shared/data/wikitext-2. "
            "A dataset downloaded once is reused offline from the Hugging Face cache; "
            "HF_HUB_OFFLINE=1 skips the network retries.")


class HubCorpus(Corpus):
    """A Hugging Face Hub dataset, downloaded to the HF cache or streamed (hub.streaming)."""

    def __init__(self, cfg: DataConfig):
        super().__init__(cfg)
        hub = cfg.hub
        names = {"train": hub.train_split, "valid": hub.valid_split, "test": hub.test_split}
        self.hub_splits = {ours: theirs for ours, theirs in names.items() if theirs}
        self.splits = tuple(self.hub_splits)

    def _records(self, split: str) -> Iterator[str]:
        hub = self.cfg.hub
        repo, config = hub.repo_and_config
        where = f"{repo}" + (f" (config {config})" if config else "") + f", split {self.hub_splits[split]}"
        try:
            import datasets

            ds = datasets.load_dataset(repo, config, split=self.hub_splits[split],
                                       streaming=hub.streaming, revision=hub.revision)
            for row in ds:
                if hub.text_field not in row:
                    raise DataError(f"Hub dataset {where} has no field {hub.text_field!r} (fields: "
                                    f"{', '.join(row)}); set data.hub.text_field")
                yield row[hub.text_field]
        except DataError:
            raise
        except Exception as e:  # network, auth, missing repo/split: all fixed the same way
            raise DataError(f"could not load the Hugging Face Hub dataset {where}: "
                            f"{type(e).__name__}: {e}\n{_hub_help(hub)}") from e

    def identity(self) -> dict:
        hub = self.cfg.hub
        return {"repo_and_config": list(hub.repo_and_config), "revision": hub.revision,
                "text_field": hub.text_field, "splits": self.hub_splits}

    def describe(self) -> str:
        repo, config = self.cfg.hub.repo_and_config
        return f"Hugging Face Hub: {repo}" + (f" ({config})" if config else "")


def resolve_files(entries: list[str], key: str) -> list[Path]:
    """Files named by ``entries`` (files, directories, globs), in a stable sorted order."""
    files: list[Path] = []
    for entry in entries:
        path = Path(entry).expanduser()
        if glob.has_magic(entry):
            matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
            found = [p for p in matches if p.is_file()]
            if not found:
                raise DataError(f"data.local.{key}: the pattern {entry!r} matches no files "
                                f"(relative paths resolve against {Path.cwd()})")
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            if not found:
                raise DataError(f"data.local.{key}: the directory {entry!r} contains no files")
        elif path.is_file():
            found = [path]
        else:
            raise DataError(f"data.local.{key}: {entry!r} does not exist (relative paths resolve "
                            f"against the current directory, {Path.cwd()}); fix the path or "
                            f"point data.local.{key} at your text files")
        files.extend(p for p in found if p not in files)
    return files


class LocalCorpus(Corpus):
    """Local text files; valid/test from their own files or carved out of train documents."""

    def __init__(self, cfg: DataConfig):
        super().__init__(cfg)
        local = cfg.local
        self.files = {split: resolve_files(getattr(local, split), split)
                      for split in SPLITS if getattr(local, split)}
        self.fractions = {split: getattr(local, f"{split}_fraction")
                          for split in ("valid", "test")
                          if split not in self.files and getattr(local, f"{split}_fraction") > 0}
        self.splits = tuple(s for s in SPLITS if s == "train" or s in self.files or s in self.fractions)
        self._assignment: Optional[np.ndarray] = None

    def _records(self, split: str) -> Iterator[str]:
        import datasets

        sample_by = {"paragraph": "paragraph", "file": "document"}.get(self.cfg.documents, "line")
        files = [str(f) for f in self.files[split]]
        ds = datasets.load_dataset("text", data_files=files, split="train", streaming=True,
                                   sample_by=sample_by, encoding=self.cfg.encoding)
        try:
            yield from (row["text"] for row in ds)
        except UnicodeDecodeError as e:
            raise undecodable(self.files[split], split, self.cfg.encoding, e) from None

    def documents(self, split: str) -> Iterator[str]:
        carved = split in self.fractions or (split == "train" and self.fractions)
        if not carved:
            return super().documents(split)
        if self.cfg.local.split_mode == "characters":
            return group_documents(_records_of(self._character_part(split), self.cfg.documents),
                                   self.cfg.documents)
        # Fractions are of documents (after grouping), so an article never straddles splits.
        code = {"train": 0, "valid": 1, "test": 2}[split]
        assignment = self._split_assignment()
        return (doc for doc, a in zip(super().documents("train"), assignment) if a == code)

    def _split_assignment(self) -> np.ndarray:
        """0/1/2 (train/valid/test) per training document: exact fractions, seeded or tail."""
        if self._assignment is not None:
            return self._assignment
        n = sum(1 for _ in super().documents("train"))
        counts = {s: round(f * n) for s, f in self.fractions.items()}
        if n - sum(counts.values()) < 1 or any(c < 1 for c in counts.values()):
            asked = " and ".join(f"{f:.0%} {s}" for s, f in self.fractions.items())
            raise DataError(f"data.local: the training text holds {n} document{'s' if n != 1 else ''} "
                            f"(data.documents={self.cfg.documents}), too few to set aside {asked} as whole "
                            "documents with one at least in each split. To cut a single text at a "
                            "character fraction (as nanoGPT splits Tiny Shakespeare 90/10), set "
                            "data.local.split_mode=characters; or give valid/test files, or add text")
        # Taken from the front of `order`; tail mode reads from the end, so the file ends
        # up as train | valid | test.
        order = (np.random.default_rng(self.cfg.local.split_seed).permutation(n)
                 if self.cfg.local.split_mode == "random" else np.arange(n)[::-1])
        assignment = np.zeros(n, dtype=np.uint8)
        start = 0
        for split, code in (("test", 2), ("valid", 1)):
            if split in counts:
                assignment[order[start:start + counts[split]]] = code
                start += counts[split]
        self._assignment = assignment
        return assignment

    def _character_part(self, split: str) -> str:
        """``split``'s part of the training text cut at character fractions: train | valid | test."""
        text = "".join(_read_text(f, "train", self.cfg.encoding) for f in self.files["train"])
        n = len(text)
        valid, test = self.fractions.get("valid", 0.0), self.fractions.get("test", 0.0)
        cuts = {"train": (0, int(n * (1 - valid - test))),
                "valid": (int(n * (1 - valid - test)), int(n * (1 - test))), "test": (int(n * (1 - test)), n)}
        start, end = cuts[split]
        if end <= start:
            raise DataError(f"data.local: the training text has {n} characters, too few to give the {split} "
                            "split any; add text or change the fractions")
        return text[start:end]

    def identity(self) -> dict:
        # Path + size + mtime stands in for the content: cheap even for large corpora.
        return {split: [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
                for split, files in self.files.items()}

    def describe(self) -> str:
        return "local files: " + "; ".join(f"{split}: {', '.join(map(str, files))}"
                                             for split, files in self.files.items())


def _records_of(text: str, mode: str) -> Iterator[str]:
    """A text's records as the ``text`` loader makes them: lines, paragraphs, or the whole."""
    if mode == "file":
        return iter([text])
    if mode == "paragraph":
        return iter(text.split("\n\n"))
    return iter(text.splitlines())


def _read_text(path: Path, split: str, encoding: str) -> str:
    try:
        return path.read_bytes().decode(encoding)
    except UnicodeDecodeError as e:
        raise undecodable([path], split, encoding, e) from None


def _first_undecodable(files: list[Path], encoding: str) -> Optional[tuple[Path, int, str]]:
    """(file, byte offset, reason) of the first bytes that ``encoding`` cannot decode."""
    for path in files:
        decoder = codecs.getincrementaldecoder(encoding)()
        offset = 0
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                pending = len(decoder.getstate()[0])
                try:
                    decoder.decode(chunk, final=not chunk)
                except UnicodeDecodeError as e:
                    return path, offset - pending + e.start, e.reason
                if not chunk:
                    break
                offset += len(chunk)
    return None


def undecodable(files: list[Path], split: str, encoding: str, error: UnicodeDecodeError) -> DataError:
    """The DataError for text that is not in ``encoding``: which file, which byte, what to do."""
    found = _first_undecodable(files, encoding)
    if found is None:  # the loader's error without a byte we can find again: say what it said
        where, detail = ", ".join(map(str, files)), error.reason
    else:
        path, offset, detail = found
        with open(path, "rb") as f:
            f.seek(offset)
            byte = f.read(1)
        where = f"{path} at byte {offset} (0x{byte.hex()}: {detail})"
        detail = ""
    return DataError(f"data.local.{split}: {where} is not valid {encoding} text{f' ({detail})' if detail else ''}. "
                     "If the file is text in another encoding, name it with data.encoding (e.g. "
                     "data.encoding=latin-1 or cp1252); a binary file does not belong in a text corpus")


def open_corpus(cfg: DataConfig) -> Corpus:
    if cfg.source == "synthetic":
        raise DataError("data.source=synthetic has no corpus: its task instances are made on the fly "
                        "(data/tasks/). Score synthetic runs with ropelab tasks, not by perplexity.")
    return {"builtin": BuiltinCorpus, "hub": HubCorpus, "local": LocalCorpus}[cfg.source](cfg)
