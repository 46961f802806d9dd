"""Corpus -> tokenizer + flat token files per split, cached by what determines them.

Layout of a prepared directory (``<cache>/<source>-<tokenizer>-<hash>/``)::

    tokenizer.json   train.bin  valid.bin  [test.bin]   meta.json

``*.bin`` are the splits' token ids back to back (uint16 when the vocabulary fits, else
uint32), every document followed by ``<|endoftext|>``. The directory name carries a hash
of the data config parts that determine the tokens plus the source's identity (local
files: path, size, mtime; built-in: the Python version and stdlib listing; Hub: repo,
config, revision), so the same config reuses it at once and any change rebuilds.
A build writes into a temporary directory, writes meta.json last and renames the directory
into place (common/atomic.py); a directory without meta.json is never used. A lock file
keeps two processes (e.g. two ranks) from building the same thing twice. Evaluation
prepares only the split it scores, with the run's own tokenizer (``kind: file``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import time
from collections import deque
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
from tqdm import tqdm

from ropelab.configs.schema import DataConfig
from ropelab.common.atomic import atomic_directory, remove_leftovers
from ropelab.common.storage import is_storage_error, make_dir, storage_error
from ropelab.data.sources import Corpus, open_corpus
from ropelab.data.tokenizers import Tokenizer, load_tokenizer, tokenizer_from_json, train_tokenizer
from ropelab.common.errors import DataError
from ropelab.common.logs import get_logger

logger = get_logger(__name__)

FORMAT_VERSION = 1  # bump when the token files' content or layout changes
CHUNK_CHARS = 1 << 20  # text per worker task: big enough to amortise pickling


class DamagedData(DataError):
    """A prepared data directory whose files are corrupt or truncated: prepare it again."""

    def __init__(self, directory: Path, problem: str):
        super().__init__(f"{problem}; delete {directory} to prepare the data again")
        self.problem = problem


@dataclasses.dataclass
class PreparedData:
    """A prepared data directory: tokenizer, token files per split, meta.json."""

    dir: Path
    meta: dict
    tokenizer: Tokenizer

    @classmethod
    def load(cls, directory: str | Path) -> PreparedData:
        directory = Path(directory)
        meta_path = directory / "meta.json"
        if not meta_path.is_file():
            raise DataError(f"{directory} is not a prepared data directory (no meta.json)")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            itemsize = np.dtype(meta["dtype"]).itemsize
            files = {split: (directory / info["file"], int(info["tokens"])) for split, info in meta["splits"].items()}
            tokenizer_file = directory / meta["tokenizer"]["file"]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise DamagedData(directory, f"{meta_path} is corrupt ({type(e).__name__}: {e})") from None
        for path, tokens in files.values():
            if not path.is_file() or path.stat().st_size != tokens * itemsize:
                raise DamagedData(directory, f"{path} is missing or truncated ({tokens} tokens expected)")
        try:
            tokenizer = load_tokenizer(tokenizer_file)
        except DataError as e:
            raise DamagedData(directory, str(e)) from None
        return cls(directory, meta, tokenizer)

    @property
    def splits(self) -> list[str]:
        return list(self.meta["splits"])

    def split(self, name: str) -> np.memmap:
        """The split's tokens, memory-mapped read-only (nothing is loaded into RAM)."""
        if name not in self.meta["splits"]:
            raise DataError(f"the prepared data has no {name!r} split (it has "
                            f"{', '.join(self.splits)}); see {self.dir / 'meta.json'}")
        return np.memmap(self.dir / self.meta["splits"][name]["file"], dtype=self.meta["dtype"], mode="r")


def cache_root(cfg: DataConfig) -> Path:
    """data.cache_dir, else $ROPELAB_CACHE, else .cache/ropelab/data (relative to the cwd)."""
    return Path(cfg.cache_dir or os.environ.get("ROPELAB_CACHE") or ".cache/ropelab/data")


def token_config(cfg: DataConfig) -> dict:
    """The parts of the data config that change the tokens (not cache_dir, num_proc, streaming)."""
    out = {"source": cfg.source, "documents": cfg.documents,
           "tokenizer": dataclasses.asdict(cfg.tokenizer)}
    if cfg.tokenizer.kind == "file":  # what is in the file, wherever it lies
        out["tokenizer"]["path"] = _file_digest(cfg.tokenizer.path)
    if cfg.source == "hub":
        out["hub"] = {k: v for k, v in dataclasses.asdict(cfg.hub).items() if k != "streaming"}
    if cfg.source == "local":
        out["local"] = dataclasses.asdict(cfg.local)
        if cfg.encoding != "utf-8":  # only then, so caches built before the key existed stay valid
            out["encoding"] = cfg.encoding
    return out


def _file_digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        raise DataError(f"data.tokenizer.path: cannot read {path} ({e.strerror}); give the path "
                        "of a tokenizer.json") from None


def data_key(cfg: DataConfig, corpus: Corpus, splits: Optional[tuple[str, ...]] = None) -> str:
    payload = {"format": FORMAT_VERSION, "config": token_config(cfg), "source": corpus.identity()}
    if splits is not None:
        payload["splits"] = sorted(splits)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def prepare_data(cfg: DataConfig, progress: bool = True,
                 splits: Optional[Iterable[str]] = None) -> PreparedData:
    """Tokenize the corpus ``cfg`` describes into the cache (or reuse it) and open it.

    ``splits`` limits the work to those splits (evaluation needs one); by default all.
    With more than one tokenizing process (``data.num_proc``), tokenizing a new corpus runs in
    a pool of *spawned* processes, which import the calling script again: a script that
    calls this must keep its work under a main-module guard (the ``__name__`` check), or
    each worker re-runs it and waits for the lock its parent holds.
    """
    corpus = open_corpus(cfg)
    wanted = None if splits is None else tuple(splits)
    for split in wanted or ():
        if split not in corpus.splits:
            raise DataError(f"{corpus.describe()} has no {split!r} split (it has {', '.join(corpus.splits)})")
    key = data_key(cfg, corpus, wanted)
    root, final = cache_root(cfg), _prepared_dir(cfg, key)
    ready = _load_if_intact(final, say=True)
    if ready is not None:
        return ready
    make_dir(root, "data.cache_dir" if cfg.cache_dir else "the data cache ($ROPELAB_CACHE or .cache/ropelab/data)")
    with _exclusive(root / f"{final.name}.lock"):
        ready = _load_if_intact(final)  # another process built it while we waited
        if ready is not None:
            return ready
        # We hold the lock, so no other build of this directory is in progress.
        remove_leftovers(final)
        _remove_stale_locks(root)
        if final.is_dir():
            shutil.rmtree(final)
        try:
            with atomic_directory(final) as tmp:
                _build(cfg, corpus, wanted or corpus.splits, key, tmp, progress)
        except OSError as e:
            if not is_storage_error(e):
                raise
            raise storage_error(e, f"write the prepared data {final}", root) from None
    return PreparedData.load(final)


def _prepared_dir(cfg: DataConfig, key: str) -> Path:
    """Where the corpus ``cfg`` describes is (or will be) prepared: named by its content ``key``."""
    tok = cfg.tokenizer
    return cache_root(cfg) / f"{cfg.source}-{tok.kind}{tok.vocab_size if tok.kind == 'bpe' else ''}-{key[:16]}"


def cached_data(cfg: DataConfig) -> Optional[PreparedData]:
    """The corpus ``cfg`` describes as already prepared (every split), or None where it is not:
    nothing is read from the network, tokenized or written (a grid's ``--dry-run``)."""
    return _load_if_intact(_prepared_dir(cfg, data_key(cfg, open_corpus(cfg))))


def _load_if_intact(directory: Path, say: bool = False) -> Optional[PreparedData]:
    """The prepared data in ``directory``; None when it is absent, or damaged (it is then
    prepared again, which ``say`` says)."""
    if not (directory / "meta.json").is_file():
        return None
    try:
        return PreparedData.load(directory)
    except DamagedData as e:
        if say:
            logger.warning(f"note: {e.problem}; preparing the data again")
        return None


def _remove_stale_locks(root: Path) -> None:
    """Lock files that no process holds (left by one that was killed)."""
    try:
        import fcntl
    except ImportError:
        return
    for path in root.glob("*.lock"):
        try:
            with open(path, "r") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                path.unlink(missing_ok=True)
                fcntl.flock(f, fcntl.LOCK_UN)
        except OSError:  # held by a build in progress, or gone already
            continue


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path``; the file is removed afterwards, so no stale
    lock files pile up (one left by a killed process is removed by the next build)."""
    try:
        import fcntl
    except ImportError:  # Windows: unique temp names still keep builds apart
        yield
        return
    with open(lock_path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            lock_path.unlink(missing_ok=True)  # a process waiting on it rechecks meta.json
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(cfg: DataConfig, corpus: Corpus, wanted: tuple[str, ...], key: str, out: Path,
           progress: bool) -> None:
    if cfg.tokenizer.kind == "char":  # the alphabet of every split (see train_tokenizer)
        texts: Iterable[str] = itertools.chain.from_iterable(corpus.documents(s) for s in corpus.splits)
    else:
        texts = corpus.documents("train")
    if progress:
        logger.info(f"ropelab: preparing {corpus.describe()} -> {out.parent}")
    tokenizer = train_tokenizer(cfg.tokenizer, texts)
    tokenizer.save(out / "tokenizer.json")
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    digest = hashlib.sha256(tokenizer.to_json().encode())
    splits = {}
    num_proc = cfg.num_proc or min(2, os.cpu_count() or 1)
    with _encoder(tokenizer, num_proc) as encode:
        for split in wanted:
            terminal = progress and sys.stderr.isatty()  # a bar on a terminal, one line in a log file
            bar = tqdm(desc=f"tokenize {split}", unit="doc", disable=not terminal)
            splits[split] = _write_split(encode(_chunks(corpus.documents(split)), dtype),
                                         out / f"{split}.bin", digest, bar)
            bar.close()
            if progress and not terminal:
                info = splits[split]
                logger.info(f"ropelab: tokenized {split}: {info['documents']:,} documents, {info['tokens']:,} tokens")
            if splits[split]["documents"] == 0:
                raise DataError(f"the {split} split of {corpus.describe()} has no documents "
                                "(empty files, or only blank lines?)")
    meta = {
        "format": FORMAT_VERSION, "key": key, "source": corpus.describe(),
        "source_identity": corpus.identity(), "config": dataclasses.asdict(cfg),
        "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                      "eot_id": tokenizer.eot_id, "file": "tokenizer.json"},
        "dtype": np.dtype(dtype).name, "splits": splits, "content_hash": digest.hexdigest(),
        "python": sys.version, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")  # last


def _chunks(docs: Iterable[str]) -> Iterator[list[str]]:
    chunk, size = [], 0
    for doc in docs:
        chunk.append(doc)
        size += len(doc)
        if size >= CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _write_split(encoded: Iterator[tuple[np.ndarray, int, int]], path: Path, digest, bar) -> dict:
    tokens = documents = characters = 0
    with open(path, "wb") as f:
        for ids, n_docs, n_chars in encoded:
            f.write(ids.tobytes())
            digest.update(ids.tobytes())
            tokens, documents, characters = tokens + len(ids), documents + n_docs, characters + n_chars
            bar.update(n_docs)
    return {"file": path.name, "tokens": tokens, "documents": documents, "characters": characters}


def _encode_docs(tokenizer: Tokenizer, docs: list[str], dtype) -> tuple[np.ndarray, int, int]:
    ids: list[int] = []
    for doc_ids in tokenizer.encode_batch(docs):
        ids.extend(doc_ids)
        ids.append(tokenizer.eot_id)
    return np.asarray(ids, dtype=dtype), len(docs), sum(map(len, docs))


_WORKER_TOKENIZER: Tokenizer | None = None


def _worker_init(tokenizer_json: str) -> None:
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    _WORKER_TOKENIZER = tokenizer_from_json(tokenizer_json)


def _worker_encode(docs: list[str], dtype) -> tuple[np.ndarray, int, int]:
    return _encode_docs(_WORKER_TOKENIZER, docs, dtype)


@contextlib.contextmanager
def _encoder(tokenizer: Tokenizer, num_proc: int):
    """A function chunks -> encoded chunks (in order), in-process or over a process pool."""
    if num_proc == 1:
        yield lambda chunks, dtype: (_encode_docs(tokenizer, c, dtype) for c in chunks)
        return
    # spawn, not fork: forking after tokenizers/torch started threads can deadlock.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(num_proc, initializer=_worker_init, initargs=(tokenizer.to_json(),)) as pool:
        def encode(chunks: Iterator[list[str]], dtype) -> Iterator[tuple[np.ndarray, int, int]]:
            # A bounded window of tasks in flight: Pool.imap would read the whole corpus ahead.
            pending: deque = deque()
            for chunk in chunks:
                pending.append(pool.apply_async(_worker_encode, (chunk, dtype)))
                if len(pending) >= 2 * num_proc:
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()
        yield encode
