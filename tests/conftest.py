"""Shared helpers: tiny model configs for every positional encoding."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ropelab.common.devices import usable_cpus
from ropelab.model.config import (POS_KINDS, CopeConfig, LayerPlan, LayerType, ModelConfig, PosConfig, RopeConfig,
                                  RopeScalingConfig, TemperatureConfig)

ALL_KINDS = list(POS_KINDS)


def tiny_config(kind: str = "rope", *, pairing: str = "half", rotary_fraction: float = 1.0,
                frequency_fraction: float = 1.0, scaling: RopeScalingConfig | None = None,
                max_len: int = 64, **overrides) -> ModelConfig:
    rope = RopeConfig(pairing=pairing, rotary_fraction=rotary_fraction, frequency_fraction=frequency_fraction,
                      scaling=scaling or RopeScalingConfig())
    fields = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
    fields.update(overrides)
    # CoPE: random embeddings (the paper's zeros would make its bias vanish in every test),
    # and a cap that counts of 20-30 keys reach.
    cope = CopeConfig(max_pos=8, init_std=1.0)
    return ModelConfig(pos=PosConfig(kind=kind, max_len=max_len, rope=rope, cope=cope), **fields)


def _plan(pattern: str, **types: LayerType) -> LayerPlan:
    return LayerPlan(pattern=pattern, types=types)


def _rope(theta: float = 10000.0, **scaling) -> PosConfig:
    return PosConfig(rope=RopeConfig(theta=theta, scaling=RopeScalingConfig(**scaling)))


# Layer plans of the 2025 designs at test size (4 layers, windows of 8 keys, so a 29-token
# prompt is longer than a window), each with the features it mixes: name -> (kind, plan).
PLANS = {
    # NoPE every 4th layer with Llama 4's temperature on it (floor 4, so it acts by position 3).
    "irope": ("rope", _plan("RRRN", R=LayerType(), N=LayerType(
        pos=PosConfig(kind="none"), temperature=TemperatureConfig(kind="llama4", floor_scale=4)))),
    # RNoPE-SWA: sliding-window RoPE layers, a full NoPE layer.
    "rnope-swa": ("rope", _plan("SSSN", S=LayerType(window=8), N=LayerType(pos=PosConfig(kind="none")))),
    # Gemma 3: local layers at θ 10k in a window, a global layer at θ 1M with the scaling.
    "gemma3": ("rope", _plan("LLLG", L=LayerType(window=8), G=LayerType(
        pos=_rope(1e6, type="linear", factor=2.0)))),
    # gpt-oss: alternating windows and full layers, learned sinks on both.
    "gpt-oss": ("rope", _plan("LG", L=LayerType(window=8, sinks=True), G=LayerType(sinks=True))),
    "ssmax": ("rope", _plan("S", S=LayerType(temperature=TemperatureConfig(kind="ssmax", ssmax_init=0.5)))),
    "ssmax-window": ("rope", _plan("SG", S=LayerType(window=8, temperature=TemperatureConfig(kind="ssmax")),
                                   G=LayerType())),
    # A score bias in a window with sinks, and FoX's decay in a window.
    "alibi-window-sinks": ("alibi", _plan("AG", A=LayerType(pos=PosConfig(kind="alibi"), window=8, sinks=True),
                                          G=LayerType(pos=PosConfig(kind="alibi")))),
    "fox-window": ("fox", _plan("FG", F=LayerType(pos=PosConfig(kind="fox"), window=8),
                                G=LayerType(pos=PosConfig(kind="fox")))),
    "t5-and-rope": ("t5", _plan("TR", T=LayerType(pos=PosConfig(kind="t5")), R=LayerType(pos=PosConfig(kind="rope")))),
}


def plan_config(name: str, **overrides) -> ModelConfig:
    """A tiny 4-layer model with the layer plan ``PLANS[name]`` (its default layer's kind first)."""
    kind, plan = PLANS[name]
    base = tiny_config(kind, n_layers=4, **overrides)
    for layer in plan.types.values():  # the tiny defaults (CoPE's cap, a table size) on each type
        layer.pos.max_len = base.pos.max_len
    return ModelConfig(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, "layers": plan})


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


def write_run_config(tmp: Path, corpus: Path) -> Path:
    """A tiny byte-level run config (2 layers, d 32, seq 32) over ``corpus``, in ``tmp``."""
    cfg = f"""
name: tiny
out_dir: {tmp / 'runs'}
model: {{d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2}}
data:
  source: local
  local: {{train: [{corpus / 'train.txt'}], valid: [{corpus / 'valid.txt'}]}}
  tokenizer: {{kind: byte}}
  cache_dir: {tmp / 'cache'}
  num_proc: 1
train:
  seq_len: 32
  batch_size: 8
  max_steps: 30
  lr: 3.0e-3
  warmup_steps: 5
  eval_interval: 10
  eval_batches: 4
  ckpt_interval: 10
  log_interval: 1
  seed: 7
log: {{progress: false}}
"""
    path = tmp / "tiny.yaml"
    path.write_text(cfg)
    return path


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory, corpus) -> Path:
    """Tiny trained runs the evaluation tests share, trained once per session: ``rope-a`` and
    ``rope-b`` (seeds 1 and 2 of one experiment) and ``learned`` (a 32-position table), 20
    steps of the tiny config each. A test that changes or deletes run directories copies
    them first (``copy_runs``)."""
    from ropelab import train  # the command line itself, as a user trains

    tmp = tmp_path_factory.mktemp("runs")
    cfg = str(write_run_config(tmp, corpus))
    common = [cfg, "train.max_steps=20", "train.eval_interval=20", "train.ckpt_interval=20"]
    for name, extra in (("rope-a", ["train.seed=1"]), ("rope-b", ["train.seed=2"]),
                        ("learned", ["model.pos.kind=learned", "model.pos.max_len=32"])):
        assert train.main(common + [f"name={name}", *extra]) == 0
    return tmp / "runs"


def copy_runs(runs: Path, names: list[str], to: Path) -> list[Path]:
    """Private copies of shared runs (their evaluation caches included) under ``to``."""
    import shutil

    to.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copytree(runs / name, to / name)) for name in names]
