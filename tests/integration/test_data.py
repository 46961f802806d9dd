"""Data: sources, preparation and its cache, the built-in corpus, the training sampler
(tokenizers: test_tokenizers.py; evaluation windows: test_eval_windows.py)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ropelab.data.prepare as prepare_mod
from ropelab.configs.schema import DataConfig, LocalConfig, TokenizerConfig
from ropelab.data import EOT, TrainSampler, prepare_data
from ropelab.data.builtin import builtin_documents, split_of
from ropelab.data.prepare import PreparedData
from ropelab.data.sources import group_documents, open_corpus
from ropelab.common.errors import ConfigError, DataError

from helpers import ROOT

WIKITEXT2 = ROOT.parent / "shared" / "data" / "wikitext-2"
WORDS = ("the cat sat on a mat while dogs ran past quietly and birds sang loudly over "
         "green hills near an old river").split()


def fake_corpus(path: Path, lines: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))).capitalize() + "."
                     for _ in range(lines))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def local_cfg(tmp_path: Path, **local) -> DataConfig:
    if "train" not in local:
        local["train"] = [str(fake_corpus(tmp_path / "corpus" / "train.txt", 300))]
        local.setdefault("valid", [str(fake_corpus(tmp_path / "corpus" / "valid.txt", 40, seed=1))])
    return DataConfig(source="local", local=LocalConfig(**local), num_proc=1,
                      tokenizer=TokenizerConfig(kind="bpe", vocab_size=300),
                      cache_dir=str(tmp_path / "cache"))


def encoded(tokenizer, docs) -> list[int]:
    ids = []
    for doc in docs:
        ids += tokenizer.encode(doc) + [tokenizer.eot_id]
    return ids


# ------------------------------------------------------------------ documents and sources

def test_wikitext_grouping_starts_articles_at_titles():
    rows = [" \n", " = Alpha = \n", " \n", " First para . \n", " = = Section = = \n", " \n",
            " Key : Pld\n", " = Played , W = \n", " Wins , L\n",  # a table legend, not a title
            " \n", " \n", " = Beta = \n", " \n", " Beta text . \n", ""]
    docs = list(group_documents(rows, "wikitext"))
    assert docs == [" = Alpha = \n First para . \n = = Section = = \n Key : Pld\n = Played , W = \n Wins , L",
                    " = Beta = \n Beta text . "]
    assert list(group_documents(["a\n", " \n", "", "b"], "line")) == ["a", "b"]


def test_missing_files_and_empty_globs_raise_data_error(tmp_path):
    with pytest.raises(DataError, match="nope.txt.*does not exist"):
        open_corpus(local_cfg(tmp_path, train=[str(tmp_path / "nope.txt")], valid_fraction=0.1))
    with pytest.raises(DataError, match=r"\*\.md.*matches no files"):
        open_corpus(local_cfg(tmp_path, train=[str(tmp_path / "*.md")], valid_fraction=0.1))
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(DataError, match="emptydir.*no files"):
        open_corpus(local_cfg(tmp_path, train=[str(tmp_path / "emptydir")], valid_fraction=0.1))


def test_empty_corpus_raises_data_error(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n\n")
    cfg = local_cfg(tmp_path, train=[str(blank)], valid=[str(blank)])
    with pytest.raises(DataError, match="no documents"):
        prepare_data(cfg, progress=False)
    assert not list((tmp_path / "cache").glob("*/meta.json"))  # nothing half-built is left


def test_directories_and_globs_resolve_sorted(tmp_path):
    for name in ("b.txt", "a.txt", "sub/c.txt"):
        fake_corpus(tmp_path / "d" / name, 5, seed=len(name))
    by_dir = open_corpus(local_cfg(tmp_path, train=[str(tmp_path / "d")], valid_fraction=0.2))
    by_glob = open_corpus(local_cfg(tmp_path, train=[str(tmp_path / "d" / "**" / "*.txt")],
                                    valid_fraction=0.2))
    expected = [tmp_path / "d" / n for n in ("a.txt", "b.txt", "sub/c.txt")]
    assert by_dir.files["train"] == expected and sorted(by_glob.files["train"]) == expected


def test_split_fraction_is_deterministic_document_level(tmp_path):
    cfg = local_cfg(tmp_path, valid=[], valid_fraction=0.1, test_fraction=0.05, split_seed=3)
    all_docs = list(group_documents((tmp_path / "corpus" / "train.txt").read_text().splitlines(), "line"))
    corpus = open_corpus(cfg)
    splits = {s: list(corpus.documents(s)) for s in ("train", "valid", "test")}
    assert {s: len(d) for s, d in splits.items()} == {"train": 255, "valid": 30, "test": 15}
    assert sorted(sum(splits.values(), [])) == sorted(all_docs)  # a partition of the documents
    assert splits == {s: list(open_corpus(cfg).documents(s)) for s in splits}  # same again
    other = open_corpus(local_cfg(tmp_path, valid=[], valid_fraction=0.1, test_fraction=0.05, split_seed=4))
    assert list(other.documents("valid")) != splits["valid"]
    tail = open_corpus(local_cfg(tmp_path, valid=[], valid_fraction=0.1, split_mode="tail"))
    assert list(tail.documents("valid")) == all_docs[-30:]
    assert list(tail.documents("train")) == all_docs[:-30]


def test_hub_offline_error_explains_local_files(tmp_path):
    # A fresh process so the offline switches are read at import, as datasets does.
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from ropelab.configs.schema import DataConfig, HubConfig\n"
            "from ropelab.data import prepare_data\n"
            "from ropelab.common.errors import DataError\n"
            "try:\n"
            "    prepare_data(DataConfig(source='hub', hub=HubConfig(name='wikitext-2-raw-v1'),"
            " cache_dir=sys.argv[2], num_proc=1), progress=False)\n"
            "except DataError as e:\n"
            "    print('DATAERROR', e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets")}
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), str(tmp_path / "cache")], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=120).stdout
    assert "DATAERROR" in out, out
    assert "Salesforce/wikitext" in out and "wikitext-2-raw-v1" in out
    assert "data.source=local" in out and "data.local.train=" in out and "data.local.valid=" in out


# ------------------------------------------------------------------ preparation and cache

def test_prepare_writes_uint16_tokens_with_correct_counts(tmp_path):
    cfg = local_cfg(tmp_path)
    prepared = prepare_data(cfg, progress=False)
    assert prepared.meta["dtype"] == "uint16" and prepared.splits == ["train", "valid"]
    corpus = open_corpus(cfg)
    for split in ("train", "valid"):
        tokens = prepared.split(split)
        assert tokens.dtype == np.uint16
        expected = encoded(prepared.tokenizer, corpus.documents(split))
        assert tokens.tolist() == expected
        assert prepared.meta["splits"][split]["tokens"] == len(expected)
        assert prepared.meta["splits"][split]["documents"] == int((tokens == prepared.tokenizer.eot_id).sum())
    assert (prepared.dir / "tokenizer.json").is_file()
    assert prepared.meta["tokenizer"]["vocab_size"] == prepared.tokenizer.vocab_size <= 300
    with pytest.raises(DataError, match="no 'test' split"):
        prepared.split("test")


def test_prepare_reuses_cache_without_retokenizing(tmp_path, monkeypatch):
    cfg = local_cfg(tmp_path)
    first = prepare_data(cfg, progress=False)
    stamp = (first.dir / "meta.json").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("the cached data was rebuilt")

    monkeypatch.setattr(prepare_mod, "_build", fail)
    again = prepare_data(cfg, progress=False)
    assert again.dir == first.dir and again.meta == first.meta
    assert (again.dir / "meta.json").stat().st_mtime_ns == stamp


def test_prepare_rebuilds_on_config_or_content_change(tmp_path):
    cfg = local_cfg(tmp_path)
    first = prepare_data(cfg, progress=False)
    bigger = DataConfig(**{**cfg.__dict__, "tokenizer": TokenizerConfig(kind="bpe", vocab_size=320)})
    assert prepare_data(bigger, progress=False).dir != first.dir
    as_bytes = DataConfig(**{**cfg.__dict__, "tokenizer": TokenizerConfig(kind="byte")})
    assert prepare_data(as_bytes, progress=False).dir != first.dir
    # Settings that cannot change the tokens share the cache entry.
    same = DataConfig(**{**cfg.__dict__, "num_proc": 2})
    assert prepare_mod.data_key(same, open_corpus(same)) == prepare_mod.data_key(cfg, open_corpus(cfg))
    fake_corpus(tmp_path / "corpus" / "train.txt", 301)  # the file changed: size and mtime
    changed = prepare_data(cfg, progress=False)
    assert changed.dir != first.dir and changed.meta["splits"]["train"]["documents"] == 301


def test_file_tokenizer_is_used_as_is_and_keyed_by_content(tmp_path):
    """kind=file: a saved tokenizer tokenizes the corpus unchanged; the cache follows the
    file's content, not its path."""
    trained = prepare_data(local_cfg(tmp_path), progress=False)
    saved = tmp_path / "elsewhere" / "tok.json"
    saved.parent.mkdir()
    saved.write_text((trained.dir / "tokenizer.json").read_text())
    base = local_cfg(tmp_path)
    cfg = DataConfig(**{**base.__dict__, "tokenizer": TokenizerConfig(kind="file", path=str(saved))})
    from_file = prepare_data(cfg, progress=False)
    assert from_file.dir != trained.dir and from_file.tokenizer == trained.tokenizer
    assert from_file.split("train").tolist() == trained.split("train").tolist()
    copy = tmp_path / "copy.json"
    copy.write_text(saved.read_text())
    moved = DataConfig(**{**cfg.__dict__, "tokenizer": TokenizerConfig(kind="file", path=str(copy))})
    assert prepare_mod.data_key(moved, open_corpus(moved)) == prepare_mod.data_key(cfg, open_corpus(cfg))
    copy.write_text(json.dumps({"kind": "byte", "eot": EOT}))
    assert prepare_data(moved, progress=False).tokenizer.kind == "byte"
    missing = DataConfig(**{**cfg.__dict__, "tokenizer": TokenizerConfig(kind="file", path=str(tmp_path / "no.json"))})
    with pytest.raises(DataError, match="data.tokenizer.path: cannot read"):
        prepare_data(missing, progress=False)


def test_file_tokenizer_config_needs_its_path():
    with pytest.raises(ConfigError, match="data.tokenizer.path goes with data.tokenizer.kind=file"):
        TokenizerConfig(kind="file")
    with pytest.raises(ConfigError, match="kind=file"):
        TokenizerConfig(kind="bpe", path="tokenizer.json")


def test_incomplete_directories_are_never_used(tmp_path):
    cfg = local_cfg(tmp_path)
    good = prepare_data(cfg, progress=False)
    expected = good.split("train").tolist()
    # Simulate an interrupted build: a directory without meta.json plus a stale temp dir.
    (good.dir / "meta.json").unlink()
    (good.dir / "train.bin").write_bytes(b"\x01\x00" * 3)
    stale = good.dir.parent / f".{good.dir.name}.tmp-999-deadbeef"  # as common/atomic.py names them
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"junk")
    rebuilt = prepare_data(cfg, progress=False)
    assert rebuilt.split("train").tolist() == expected
    assert not stale.exists()


def test_damaged_cache_is_reported_and_prepared_again(tmp_path, caplog):
    cfg = local_cfg(tmp_path)
    prepared = prepare_data(cfg, progress=False)
    expected = prepared.split("valid").tolist()
    with pytest.raises(DataError, match="valid.bin is missing or truncated"):
        (prepared.dir / "valid.bin").write_bytes(b"\x00\x00")
        PreparedData.load(prepared.dir)
    for name, damage in (("valid.bin", b"\x00\x00"), ("meta.json", b"{not json"), ("tokenizer.json", b"\xff")):
        (prepared.dir / name).write_bytes(damage)
        assert prepare_data(cfg, progress=False).split("valid").tolist() == expected
        assert "preparing the data again" in caplog.text
        caplog.clear()
    assert not list(prepared.dir.parent.glob("*.lock"))  # no lock files left behind


def test_process_pool_gives_identical_tokens(tmp_path):
    cfg = local_cfg(tmp_path)
    one = prepare_data(cfg, progress=False)
    pooled_cfg = DataConfig(**{**cfg.__dict__, "num_proc": 2, "cache_dir": str(tmp_path / "cache2")})
    monkey_chunk = prepare_mod.CHUNK_CHARS
    prepare_mod.CHUNK_CHARS = 500  # many small tasks, so ordering across workers matters
    try:
        two = prepare_data(pooled_cfg, progress=False)
    finally:
        prepare_mod.CHUNK_CHARS = monkey_chunk
    assert two.meta["content_hash"] == one.meta["content_hash"]
    assert two.split("train").tolist() == one.split("train").tolist()


def test_split_fraction_prepare_is_deterministic(tmp_path):
    cfg = local_cfg(tmp_path, valid=[], valid_fraction=0.1)
    a = prepare_data(cfg, progress=False)
    b = prepare_data(DataConfig(**{**cfg.__dict__, "cache_dir": str(tmp_path / "other")}), progress=False)
    assert a.meta["content_hash"] == b.meta["content_hash"]
    assert a.meta["splits"]["valid"]["documents"] == 30


# ------------------------------------------------------------------ built-in corpus

def test_builtin_corpus_is_deterministic_and_substantial():
    docs = builtin_documents()
    digest = hashlib.sha256(json.dumps(docs).encode()).hexdigest()
    code = ("import sys, json, hashlib; sys.path.insert(0, sys.argv[1]); "
            "from ropelab.data.builtin import builtin_documents; "
            "print(hashlib.sha256(json.dumps(builtin_documents()).encode()).hexdigest())")
    env = {**os.environ, "PYTHONHASHSEED": "987"}
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True,
                         env=env, cwd=ROOT, check=True).stdout.split()[-1]
    assert out == digest
    assert len(docs) > 300 and sum(len(t) for _, t in docs) > 1_000_000
    chars = {s: sum(len(t) for title, t in docs if split_of(title) == s) for s in ("train", "valid", "test")}
    assert chars["train"] > 5 * chars["valid"] > 0 and chars["test"] > 0


def test_builtin_corpus_prepares(tmp_path):
    cfg = DataConfig(source="builtin", tokenizer=TokenizerConfig(kind="byte"), num_proc=1,
                     cache_dir=str(tmp_path))
    prepared = prepare_data(cfg, progress=False)
    assert prepared.splits == ["train", "valid", "test"]
    assert prepared.meta["splits"]["valid"]["tokens"] > 50_000
    text = prepared.tokenizer.decode(prepared.split("train")[:2000].tolist())
    assert EOT in text and "Module" in text


# ------------------------------------------------------------------ real WikiText-2 files

@pytest.mark.slow
@pytest.mark.skipif(not (WIKITEXT2 / "train.txt").is_file(), reason="../shared/data/wikitext-2 absent")
def test_prepare_real_wikitext2_local(tmp_path):
    cfg = DataConfig(source="local", documents="wikitext", cache_dir=str(tmp_path),
                     local=LocalConfig(train=[str(WIKITEXT2 / "train.txt")],
                                       valid=[str(WIKITEXT2 / "valid.txt")],
                                       test=[str(WIKITEXT2 / "test.txt")]),
                     tokenizer=TokenizerConfig(kind="bpe", vocab_size=1024), num_proc=2)
    prepared = prepare_data(cfg, progress=False)
    splits = prepared.meta["splits"]
    # WikiText-2 has 600 / 60 / 60 articles (Merity et al. 2016).
    assert [splits[s]["documents"] for s in ("train", "valid", "test")] == [600, 60, 60]
    # ~2.09M / 0.22M / 0.25M words; a 1024-token BPE needs somewhat more tokens than words.
    assert 2.0e6 < splits["train"]["tokens"] < 6.0e6
    assert 0.08 < splits["valid"]["tokens"] / splits["train"]["tokens"] < 0.14
    assert 0.09 < splits["test"]["tokens"] / splits["train"]["tokens"] < 0.15


# ------------------------------------------------------------------ training sampler

def toy_tokens(n: int = 5000) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 60000, size=n).astype(np.uint16)


def test_sampler_same_seed_same_batches_and_shift():
    tokens = toy_tokens()
    a, b = TrainSampler(tokens, 32, 4, seed=7), TrainSampler(tokens, 32, 4, seed=7)
    for _ in range(3):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert xa.shape == ya.shape == (4, 32) and xa.dtype == ya.dtype == torch.int64
    assert torch.equal(xa[:, 1:], ya[:, :-1])
    flat = tokens.astype(np.int64)
    for row_x, row_y in zip(xa.numpy(), ya.numpy()):  # each row is a real window of the file
        start = next(s for s in range(len(flat)) if np.array_equal(flat[s:s + 32], row_x))
        assert np.array_equal(flat[start + 1:start + 33], row_y)
    c = TrainSampler(tokens, 32, 4, seed=8)
    assert not torch.equal(c.next_batch()[0], TrainSampler(tokens, 32, 4, seed=7).next_batch()[0])


def test_sampler_state_restores_exactly():
    tokens = toy_tokens()
    run = TrainSampler(tokens, 16, 3, seed=1)
    for _ in range(5):
        run.next_batch()
    state = json.loads(json.dumps(run.state_dict()))  # plain, JSON-serialisable
    expected = [run.next_batch() for _ in range(4)]
    resumed = TrainSampler(tokens, 16, 3, seed=999)
    resumed.load_state_dict(state)
    for x, y in expected:
        rx, ry = resumed.next_batch()
        assert torch.equal(rx, x) and torch.equal(ry, y)


def test_two_ranks_equal_one_rank_with_double_batch():
    tokens = toy_tokens()
    single = TrainSampler(tokens, 16, 8, seed=3)
    ranks = [TrainSampler(tokens, 16, 4, seed=3, rank=r, world_size=2) for r in range(2)]
    for _ in range(3):
        x, y = single.next_batch()
        parts = [s.next_batch() for s in ranks]
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)
        assert not torch.equal(parts[0][0], parts[1][0])


def test_sampler_windows_stay_inside_and_reach_the_end():
    tokens = np.arange(20, dtype=np.uint16)
    sampler = TrainSampler(tokens, 4, 64, seed=0)
    starts = np.concatenate([sampler.offsets(k) for k in range(20)])
    assert starts.min() == 0 and starts.max() == 20 - 5
    with pytest.raises(DataError, match="fewer than one window"):
        TrainSampler(tokens, 20, 1, seed=0)


def test_a_single_text_splits_at_a_character_fraction(tmp_path):
    """nanoGPT's Tiny Shakespeare split: the first int(0.9 n) characters train, the rest validate."""
    text = "".join(f"line {i}: to be or not to be\n" for i in range(300))
    path = tmp_path / "input.txt"
    path.write_text(text)
    cut = int(len(text) * 0.9)
    for documents in ("file", "line"):
        cfg = DataConfig(source="local", documents=documents, local=LocalConfig(
            train=[str(path)], valid_fraction=0.1, split_mode="characters"))
        corpus = open_corpus(cfg)
        train_docs, valid_docs = list(corpus.documents("train")), list(corpus.documents("valid"))
        joined = "" if documents == "file" else "\n"
        assert joined.join(train_docs).strip() == text[:cut].strip()
        assert joined.join(valid_docs).strip() == text[cut:].strip()
    by_documents = DataConfig(source="local", documents="file", local=LocalConfig(train=[str(path)], valid_fraction=0.1))
    with pytest.raises(DataError, match="split_mode=characters") as e:
        list(open_corpus(by_documents).documents("valid"))
    assert "{" not in str(e.value)  # no Python dict shown to the user
