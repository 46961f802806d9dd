"""Fixtures every test may ask for: a seeded torch, private caches, a small corpus and tiny
trained runs; threads split between pytest-xdist's workers. Code the tests import lives in
tests/helpers/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ropelab.common.devices import usable_cpus

from helpers.runs import write_run_config


def pytest_configure(config):
    """Under pytest-xdist (``-n auto``) each worker gets its share of the cores, it and the
    training and evaluation processes it starts: two workers with torch's default of a
    thread per core would each spin on both cores of a 2-core machine."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        threads = max(1, usable_cpus() // int(workers))
        torch.set_num_threads(threads)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(threads))


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True, scope="session")
def _private_caches(tmp_path_factory):
    """Shape timings and compiled kernels (training/step_timing.py) go to the session's own directory,
    never the user's cache."""
    root = tmp_path_factory.mktemp("caches")
    saved = {k: os.environ.get(k) for k in ("ROPELAB_PROBE_CACHE", "TORCHINDUCTOR_CACHE_DIR")}
    os.environ["ROPELAB_PROBE_CACHE"], os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "probes"), str(root / "inductor")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A small deterministic text corpus with train/valid files."""
    d = tmp_path_factory.mktemp("corpus")
    words = "the cat sat on a mat while rope and alibi rotate every token position".split()
    gen = torch.Generator().manual_seed(0)
    for split, n in (("train", 3000), ("valid", 400)):
        idx = torch.randint(0, len(words), (n, 9), generator=gen).tolist()
        (d / f"{split}.txt").write_text("\n".join(" ".join(words[i] for i in row) + "." for row in idx) + "\n")
    return d


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory, corpus) -> Path:
    """Tiny trained runs the evaluation tests share, trained once per session: ``rope-a`` and
    ``rope-b`` (seeds 1 and 2 of one experiment) and ``learned`` (a 32-position table), 20
    steps of the tiny config each. A test that changes or deletes run directories copies
    them first (``helpers.runs.copy_runs``)."""
    from ropelab import train  # the command line itself, as a user trains

    tmp = tmp_path_factory.mktemp("runs")
    cfg = str(write_run_config(tmp, corpus))
    common = [cfg, "train.max_steps=20", "train.eval_interval=20", "train.ckpt_interval=20"]
    for name, extra in (("rope-a", ["train.seed=1"]), ("rope-b", ["train.seed=2"]),
                        ("learned", ["model.pos.kind=learned", "model.pos.max_len=32"])):
        assert train.main(common + [f"name={name}", *extra]) == 0
    return tmp / "runs"
