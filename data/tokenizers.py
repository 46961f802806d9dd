"""Tokenizers behind one small interface: bpe (byte-level BPE), byte, char.

Every tokenizer has ``encode(str) -> list[int]``, ``decode(list[int]) -> str``,
``vocab_size``, ``eot_id`` (the ``<|endoftext|>`` token that ends every document) and
``save(path)``; ``load_tokenizer(path)`` reads any of them back without retraining.
bpe saves the Hugging Face ``tokenizer.json`` format unchanged (so other tools can read
it); byte and char save a small JSON of our own with a ``kind`` field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from configs.schema import TokenizerConfig
from model.errors import DataError

EOT = "<|endoftext|>"


class Tokenizer:
    """The common interface; subclasses implement encode/decode/to_json."""

    kind: str
    vocab_size: int
    eot_id: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def to_json(self) -> str:
        raise NotImplementedError

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes each id stands for (int64, (vocab_size,)), for bits per byte.

        <|endoftext|> counts as one byte: it stands for the break between documents.
        """
        raise NotImplementedError

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, eot_id={self.eot_id})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes 0..255, then <|endoftext|> = 256."""

    kind = "byte"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        out, pending = [], bytearray()
        for i in ids:
            if i == self.eot_id:
                out.append(pending.decode("utf-8", errors="replace") + EOT)
                pending = bytearray()
            else:
                pending.append(i)
        return "".join(out) + pending.decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"kind": "byte", "eot": EOT})

    def token_bytes(self) -> np.ndarray:
        return np.ones(self.vocab_size, dtype=np.int64)


class CharTokenizer(Tokenizer):
    """One id per distinct character of the corpus (sorted), then <|endoftext|>."""

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        self.chars = "".join(sorted(set(chars)))
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.eot_id = len(self.chars)
        self.vocab_size = len(self.chars) + 1

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[c] for c in text]
        except KeyError as e:
            raise DataError(f"character {e.args[0]!r} is not in this char tokenizer's vocabulary "
                            f"({len(self.chars)} characters seen in the corpus)") from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(EOT if i == self.eot_id else self.chars[i] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"kind": "char", "eot": EOT, "chars": self.chars}, ensure_ascii=False)

    def token_bytes(self) -> np.ndarray:
        return np.array([len(c.encode("utf-8")) for c in self.chars] + [1], dtype=np.int64)


class BPETokenizer(Tokenizer):
    """Byte-level BPE (GPT-2 style) from Hugging Face ``tokenizers``."""

    kind = "bpe"

    def __init__(self, hf_tokenizer):
        self.hf = hf_tokenizer
        self.vocab_size = hf_tokenizer.get_vocab_size()
        self.eot_id = hf_tokenizer.token_to_id(EOT)
        if self.eot_id is None:
            raise DataError(f"this BPE tokenizer has no {EOT} token; retrain it with ropelab")

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False)

    def to_json(self) -> str:
        return self.hf.to_str()

    def token_bytes(self) -> np.ndarray:
        # Byte-level BPE writes each byte as one printable character (GPT-2's byte-to-unicode
        # table), so a token's length in characters is its length in bytes.
        out = np.ones(self.vocab_size, dtype=np.int64)
        for token, i in self.hf.get_vocab().items():
            if i != self.eot_id:
                out[i] = len(token)
        return out


def _train_bpe(cfg: TokenizerConfig, texts: Iterable[str]) -> BPETokenizer:
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE())
    # add_prefix_space=False: a document's first word is encoded as written.
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency, special_tokens=[EOT],
        # All 256 byte symbols up front, so any text encodes (no unknown token needed).
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    hf.train_from_iterator(_capped(texts, cfg.max_train_chars), trainer=trainer)
    return BPETokenizer(hf)


def _capped(texts: Iterable[str], max_chars: int | None) -> Iterator[str]:
    total = 0
    for text in texts:
        if max_chars is not None and total + len(text) > max_chars:
            if max_chars - total:
                yield text[: max_chars - total]
            return
        total += len(text)
        yield text


def train_tokenizer(cfg: TokenizerConfig, texts: Iterable[str]) -> Tokenizer:
    """Build the tokenizer ``cfg`` describes from ``texts`` (deterministic in their order).

    bpe wants the training split; char wants every split (its vocabulary is just the
    alphabet, and an unseen character in valid/test could not be encoded); byte ignores them.
    """
    if cfg.kind == "byte":
        return ByteTokenizer()
    if cfg.kind == "char":
        chars: set[str] = set()
        for text in texts:
            chars.update(text)
        if not chars:
            raise DataError("cannot build a char tokenizer from an empty corpus")
        return CharTokenizer(chars)
    return _train_bpe(cfg, texts)


def tokenizer_from_json(text: str) -> Tokenizer:
    obj = json.loads(text)
    kind = obj.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer(obj["chars"])
    if kind is None and "model" in obj:  # a Hugging Face tokenizer.json
        from tokenizers import Tokenizer as HFTokenizer

        return BPETokenizer(HFTokenizer.from_str(text))
    raise DataError(f"not a ropelab tokenizer (kind={kind!r})")


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a tokenizer.json written by ``Tokenizer.save``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"tokenizer file not found: {path}") from None
    try:
        return tokenizer_from_json(text)
    except (ValueError, KeyError) as e:  # json.JSONDecodeError is a ValueError
        raise DataError(f"cannot read tokenizer {path}: {e}") from None
