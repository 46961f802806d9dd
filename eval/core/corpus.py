"""The corpus an evaluation scores, always tokenized with the evaluated run's own tokenizer.

An ``EvalCorpus`` (configs/eval_config.py) becomes a data config whose tokenizer is the run's
tokenizer.json used as is (``kind: file``), prepared through the same cached pipeline as
training data but only for the one split that is scored (data/prepare.py). A tokenizer
is never trained or retrained here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ropelab.configs.schema import DataConfig, EvalConfig, EvalCorpus, HubConfig, LocalConfig, TokenizerConfig
from ropelab.data.prepare import prepare_data
from ropelab.common.errors import DataError
from ropelab.training.saved_run import SavedRun


@dataclass
class CorpusTokens:
    name: str  # how reports call it
    tokens: np.ndarray  # the scored split, memory-mapped
    within_document: bool


def corpus_data(corpus: EvalCorpus, saved: SavedRun, default_split: str) -> tuple[DataConfig, str]:
    """(data config with the run's own tokenizer, the split to prepare) for ``corpus``."""
    own = TokenizerConfig(kind="file", path=str(saved.run.tokenizer))
    run_data = saved.cfg.data
    common = dict(tokenizer=own, cache_dir=run_data.cache_dir, num_proc=run_data.num_proc)
    if corpus.source == "run":
        return dataclasses.replace(run_data, tokenizer=own), corpus.split or default_split
    if corpus.source == "builtin":
        return DataConfig(source="builtin", documents=corpus.documents or "line", **common), \
            corpus.split or default_split
    if corpus.source == "hub":
        hub = HubConfig(name=corpus.hub)
        hub = dataclasses.replace(hub, valid_split=corpus.split or hub.valid_split, test_split=None)
        return DataConfig(source="hub", hub=hub, documents=corpus.documents or "line", **common), "valid"
    # Local files are the split that is scored; they also stand in as the (never tokenized)
    # training files the data config requires.
    local = LocalConfig(train=list(corpus.paths), valid=list(corpus.paths))
    return DataConfig(source="local", local=local, documents=corpus.documents or "file", **common), "valid"


def corpus_name(corpus: EvalCorpus, saved: SavedRun, split: str) -> str:
    if corpus.name:
        return corpus.name
    if corpus.source == "run":
        data = saved.cfg.data
        where = {"builtin": "built-in", "hub": data.hub.name,
                 "local": ", ".join(Path(p).name for p in getattr(data.local, split, []) or data.local.train)}
        return f"{where[data.source]} ({split})"
    if corpus.source == "local":
        return ", ".join(Path(p).name for p in corpus.paths)
    return f"{corpus.hub} ({corpus.split or 'validation'})" if corpus.source == "hub" else f"built-in ({split})"


def corpus_settings(corpus: EvalCorpus, saved: SavedRun, ev: EvalConfig) -> dict:
    """What was scored on ``corpus``, resolved (no nulls that mean "the default"): for
    results.json and the report."""
    data_cfg, split = corpus_data(corpus, saved, ev.split)
    if data_cfg.source == "hub":
        where, split = f"Hugging Face Hub: {data_cfg.hub.name}", data_cfg.hub.valid_split
    elif data_cfg.source == "local":
        files = getattr(data_cfg.local, split, None) or data_cfg.local.train
        where = "local files: " + ", ".join(files)
        if corpus.source == "local":
            split = "whole files"
    else:
        where = "built-in: Python's documentation"
    return {"source": ("the run's own data, " if corpus.source == "run" else "") + where, "split": split,
            "documents": data_cfg.documents, "within_document": corpus.within_document,
            "lengths": sorted(set(corpus.lengths)) or ev.resolved_lengths(saved.cfg.train.seq_len),
            "protocols": list(corpus.protocols or ev.protocols), "max_tokens": ev.max_tokens,
            "stride": ev.stride, "factor": ev.factor, "scalings": ev.resolved_scalings(saved.cfg.model.pos.kind)}


def load_corpus(saved: SavedRun, corpus: EvalCorpus, ev: EvalConfig) -> CorpusTokens:
    data_cfg, split = corpus_data(corpus, saved, ev.split)
    data = prepare_data(data_cfg, progress=False, splits=[split])
    if data.tokenizer != saved.tokenizer:  # unreachable unless the cache was tampered with
        raise DataError(f"the prepared data in {data.dir} does not match {saved.run.tokenizer}; "
                        "delete that directory and evaluate again")
    return CorpusTokens(corpus_name(corpus, saved, split), data.split(split), corpus.within_document)
