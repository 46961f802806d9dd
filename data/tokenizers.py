"""Tokenizers behind one small interface: bpe (byte-level BPE), byte, char.

Every tokenizer has ``encode(str) -> list[int]``, ``decode(list[int]) -> str``,
``vocab_size``, ``eot_id`` (the ``<|endoftext|>`` token that ends every document) and
``save(path)``; ``load_tokenizer(path)`` reads any of them back without retraining.
bpe saves the Hugging Face ``tokenizer.json`` format unchanged (so other tools can read
it); byte and char save a small JSON of our own with a ``kind`` field.

For export to Hugging Face transformers (model/hf.py) every tokenizer can also build a
``tokenizers`` object that produces the same ids (``to_hf``), and a foreign fast
tokenizer whose end-of-text token is not ``<|endoftext|>`` (``</s>``, ``<|end_of_text|>``
…) is wrapped as kind ``hf``, which records that token's name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ropelab.configs.schema import TokenizerConfig
from ropelab.common.errors import DataError

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

    def to_hf(self):
        """A ``tokenizers.Tokenizer`` giving the same ids, with <|endoftext|> as a special token.

        Used to export runs as Hugging Face fast tokenizers (tokenizer.json).
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

    def to_hf(self):
        from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

        # Byte-level BPE without merges: the ByteLevel pre-tokenizer turns every byte into
        # one printable symbol, and symbol of byte b gets id b. No regex split, so the
        # whole text is one word and nothing but bytes come out.
        vocab = {symbol: b for b, symbol in enumerate(byte_symbols())}
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        hf.decoder = decoders.ByteLevel()
        _add_eot(hf, self.eot_id)
        return hf


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

    def to_hf(self):
        from tokenizers import Tokenizer as HFTokenizer, decoders, models

        # A merge-free BPE splits its input into characters and looks each one up. A
        # character outside the vocabulary is dropped there (ours raises DataError): a
        # fast tokenizer has no way to refuse input.
        hf = HFTokenizer(models.BPE(vocab=dict(self.index), merges=[]))
        hf.decoder = decoders.Fuse()
        _add_eot(hf, self.eot_id)
        return hf


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

    def to_hf(self):
        return self.hf

    def token_bytes(self) -> np.ndarray:
        # Byte-level BPE writes each byte as one printable character (GPT-2's byte-to-unicode
        # table), so a token's length in characters is its length in bytes.
        out = np.ones(self.vocab_size, dtype=np.int64)
        for token, i in self.hf.get_vocab().items():
            if i != self.eot_id:
                out[i] = len(token)
        return out


class ForeignTokenizer(BPETokenizer):
    """A foreign Hugging Face fast tokenizer with its own end-of-text token (e.g. ``</s>``).

    Saved as ``{"kind": "hf", "eot": NAME, "tokenizer": <tokenizer.json>}`` so the token's
    name survives a reload; the tokenizer itself is kept unchanged. ``token_bytes`` counts
    characters per token, which is exact for byte-level BPE only (bits per byte of other
    pipelines, e.g. SentencePiece, are approximate).
    """

    kind = "hf"

    def __init__(self, hf_tokenizer, eot: str):
        self.hf = hf_tokenizer
        self.eot = eot
        self.vocab_size = hf_tokenizer.get_vocab_size()
        self.eot_id = hf_tokenizer.token_to_id(eot)
        if self.eot_id is None:
            raise DataError(f"the tokenizer has no end-of-text token {eot!r} in its vocabulary")

    def to_json(self) -> str:
        return json.dumps({"kind": "hf", "eot": self.eot, "tokenizer": json.loads(self.hf.to_str())},
                          ensure_ascii=False)


def byte_symbols() -> list[str]:
    """The printable stand-in character of each byte 0..255 in byte-level BPE (GPT-2's table).

    Bytes that are printable Latin-1 characters stand for themselves; the others
    (controls, space, soft hyphen …) take code points 256, 257, … in byte order.
    """
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    symbols, extra = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def _add_eot(hf, eot_id: int) -> None:
    from tokenizers import AddedToken

    hf.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    if hf.token_to_id(EOT) != eot_id:  # added tokens take the next free id; ours is last too
        raise AssertionError(f"{EOT} got id {hf.token_to_id(EOT)}, expected {eot_id}")


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
    alphabet, and an unseen character in valid/test could not be encoded); byte and file
    (a saved tokenizer, read as is) ignore them.
    """
    if cfg.kind == "byte":
        return ByteTokenizer()
    if cfg.kind == "file":
        return load_tokenizer(cfg.path)
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
    if not isinstance(obj, dict):
        raise DataError(f"not a ropelab tokenizer (a JSON {type(obj).__name__}, not an object)")
    kind = obj.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer(obj["chars"])
    if kind == "hf":
        from tokenizers import Tokenizer as HFTokenizer

        return ForeignTokenizer(HFTokenizer.from_str(json.dumps(obj["tokenizer"])), obj["eot"])
    if kind is None and "model" in obj:  # a Hugging Face tokenizer.json
        from tokenizers import Tokenizer as HFTokenizer

        return BPETokenizer(HFTokenizer.from_str(text))
    raise DataError(f"not a ropelab tokenizer (kind={kind!r})")


HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def save_hf_tokenizer(tokenizer: Tokenizer, directory: str | Path, max_len: int) -> None:
    """The files (HF_TOKENIZER_FILES) that ``transformers.AutoTokenizer.from_pretrained(directory)``
    loads as ``tokenizer``.

    <|endoftext|> is the EOS, BOS and pad token: every training document follows one.
    """
    directory = Path(directory)
    fast = tokenizer.to_hf()
    eot = fast.id_to_token(tokenizer.eot_id)
    (directory / "tokenizer.json").write_text(fast.to_str(), encoding="utf-8")
    special = {"bos_token": eot, "eos_token": eot, "pad_token": eot}
    config = {
        # The generic fast class loads tokenizer.json as it is; a Llama tokenizer class
        # would impose SentencePiece conventions (a prefix space, </s>) that ours lack.
        "tokenizer_class": "PreTrainedTokenizerFast", **special, "model_max_length": max_len,
        "clean_up_tokenization_spaces": False, "add_bos_token": False, "add_eos_token": False}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False),
                                                     encoding="utf-8")
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False),
                                                       encoding="utf-8")


def load_hf_tokenizer(directory: str | Path, eos_token_id: int | list[int] | None = None) -> Tokenizer:
    """The fast tokenizer of a Hugging Face model directory, with its end-of-text token.

    The EOS comes from tokenizer_config.json, else from ``eos_token_id`` (config.json; the
    first one if it is a list). ``<|endoftext|>`` gives a plain bpe tokenizer, anything
    else (``</s>`` …) a ForeignTokenizer that remembers the name.
    """
    from tokenizers import Tokenizer as HFTokenizer

    directory = Path(directory)
    if not (directory / "tokenizer.json").is_file():
        raise DataError(f"{directory} has no tokenizer.json (a fast tokenizer). Convert it with transformers: "
                        "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)")
    try:
        fast = HFTokenizer.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        eos = json.loads(config_path.read_text(encoding="utf-8")).get("eos_token") if config_path.is_file() else None
    except Exception as e:  # tokenizers raises its own exception type for bad files
        raise DataError(f"cannot read the tokenizer in {directory}: {e}") from None
    eos = eos.get("content") if isinstance(eos, dict) else eos  # a serialised AddedToken
    if eos is None and eos_token_id is not None:
        eos = fast.id_to_token(eos_token_id[0] if isinstance(eos_token_id, list) else eos_token_id)
    if eos is None:
        raise DataError(f"{directory} names no end-of-text token (eos_token in tokenizer_config.json or "
                        "eos_token_id in config.json); ropelab needs one to separate documents")
    return BPETokenizer(fast) if eos == EOT else ForeignTokenizer(fast, eos)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read a tokenizer.json written by ``Tokenizer.save``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"tokenizer file not found: {path}") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a directory; give the path of a tokenizer.json") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not a tokenizer.json (not UTF-8 text: byte {e.start})") from None
    try:
        return tokenizer_from_json(text)
    except DataError as e:
        raise DataError(f"{path}: {e}") from None
    except Exception as e:  # bad JSON, missing keys, or the tokenizers library's own error type
        first = (str(e).splitlines() or [""])[0][:200]
        raise DataError(f"{path} is not a tokenizer.json ropelab can read ({type(e).__name__}: {first})") from None
