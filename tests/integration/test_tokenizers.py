"""Tokenizers: round trips, save/load, BPE merges and determinism, char vocabularies."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys

import pytest

from ropelab.configs.schema import TokenizerConfig
from ropelab.data import EOT, load_tokenizer, train_tokenizer
from ropelab.common.errors import DataError

from helpers import ROOT

WORDS = "the cat sat on a mat while dogs ran past quietly and birds sang loudly".split()
SAMPLE = "Hello, world! Ünïcödé — 日本語 and emoji 😀.\n\tTabs,  double  spaces, <tags>."


@pytest.mark.parametrize("kind", ["bpe", "byte", "char"])
def test_tokenizer_round_trip_and_save_load(kind, tmp_path):
    texts = [SAMPLE, "The quick brown fox jumps over the lazy dog. " * 20]
    tok = train_tokenizer(TokenizerConfig(kind=kind, vocab_size=300), texts)
    for text in texts:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids) and tok.eot_id not in ids
        assert tok.decode(ids) == text
    assert tok.decode(tok.encode("ab") + [tok.eot_id] + tok.encode("c")) == f"ab{EOT}c"
    tok.save(tmp_path / "tokenizer.json")
    again = load_tokenizer(tmp_path / "tokenizer.json")
    assert again == tok and again.kind == kind
    assert (again.vocab_size, again.eot_id) == (tok.vocab_size, tok.eot_id)
    assert again.encode(SAMPLE) == tok.encode(SAMPLE)


def test_bpe_actually_merges_and_respects_vocab_size():
    text = ["the cat sat on the mat with the hat " * 50]
    tok = train_tokenizer(TokenizerConfig(kind="bpe", vocab_size=280), text)
    assert tok.vocab_size <= 280
    assert len(tok.encode("the cat sat")) < len("the cat sat".encode())


def test_char_tokenizer_rejects_unseen_characters():
    tok = train_tokenizer(TokenizerConfig(kind="char"), ["abc"])
    assert tok.vocab_size == 4 and tok.eot_id == 3
    with pytest.raises(DataError, match="'z'"):
        tok.encode("abz")


def test_bpe_training_is_deterministic_across_processes():
    texts = [fake_corpus_text(i) for i in range(50)]
    cfg = TokenizerConfig(kind="bpe", vocab_size=400)
    first = train_tokenizer(cfg, texts).to_json()
    assert train_tokenizer(cfg, texts).to_json() == first
    code = ("import sys, json, hashlib; from ropelab.configs.schema import TokenizerConfig; "
            "from ropelab.data import train_tokenizer; "
            "t = train_tokenizer(TokenizerConfig(kind='bpe', vocab_size=400), json.load(sys.stdin)); "
            "print(hashlib.sha256(t.to_json().encode()).hexdigest())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # a different hash seed than ours
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True,
                         env=env, cwd=ROOT, check=True).stdout.split()[-1]
    assert out == hashlib.sha256(first.encode()).hexdigest()


def fake_corpus_text(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(60))
