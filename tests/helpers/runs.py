"""Tiny run configs, the grid files over them, copies of trained runs, a training stopped
as if by SIGTERM, and the task-scoring command line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

import yaml

from ropelab.training.trainer import Trainer

from helpers import ROOT


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


def _flow(value) -> str:
    """A grid section's value as YAML on one line: a path or a string as it is (a string is
    YAML text already), anything else in flow style (``{train.seed: [0, 1]}``)."""
    if isinstance(value, (str, Path)):
        return str(value)

    def plain(v):
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return str(v) if isinstance(v, Path) else v
    return yaml.safe_dump(plain(value), default_flow_style=True, width=1_000_000, sort_keys=False).strip()


def write_grid(tmp: Path, corpus: Optional[Path] = None, *, name: str = "tiny-grid", base: Optional[Path] = None,
               file: Optional[str] = None, text: str = "", **sections) -> Path:
    """The grid file ``tmp/<file or name>.yaml``, one line per section: ``name``, ``base`` (a
    run config in ``tmp``; without one, ``write_run_config`` over ``corpus`` writes it now),
    ``out_dir`` (``tmp/runs`` unless given; None leaves it out, and so the base's), then
    ``sections`` in the order given (``axes={"train.seed": [0, 1]}``, ``report=tmp / "report"``),
    and last ``text`` as it is (what a test writes by hand: a key twice, a block style)."""
    base = base if base is not None else write_run_config(tmp, corpus)
    sections = {"out_dir": tmp / "runs", **sections}
    lines = [f"name: {name}", f"base: {base.name}"]
    lines += [f"{key}: {_flow(value)}" for key, value in sections.items() if value is not None]
    path = tmp / f"{file or name}.yaml"
    path.write_text("\n".join(lines) + "\n" + text)
    return path


TINY_EVAL = {"lengths": [16, 32, 64], "protocols": ["nonoverlap"], "scalings": ["none", "yarn"], "max_tokens": 1024}


def tiny_grid(tmp: Path, corpus: Path, axes: dict, name: str = "tiny-grid") -> Path:
    """A grid of ``axes`` over the tiny run config: 12 steps each, a checkpoint every 4,
    scored at 16, 32 and 64 tokens, its report in ``tmp/report``."""
    return write_grid(tmp, corpus, name=name,
                      overrides=["train.max_steps=12", "train.eval_interval=12", "train.ckpt_interval=4"],
                      axes=axes, eval=TINY_EVAL, report=tmp / "report")


def synthetic_grid(tmp: Path, overrides: str = "") -> Path:
    """A grid of RoPE and a learned table on the copy task (char tokens, L = 16, 6 steps), scored
    on task accuracy at 1× and 2× L; its base is ``tmp/syn.yaml``."""
    base = tmp / "syn.yaml"
    base.write_text("""
name: syn
model: {d_model: 32, n_layers: 2, n_heads: 4}
data: {source: synthetic, tokenizer: {kind: char}, synthetic: {tasks: [copy]}}
train: {seq_len: 16, batch_size: 8, max_steps: 6, warmup_steps: 1, eval_interval: 6, eval_batches: 1,
        ckpt_interval: 6}
log: {progress: false}
""")
    return write_grid(tmp, name="syn-grid", base=base, overrides=f"[{overrides}]",
                      axes={"model.pos.kind": ["rope", "learned"]},
                      eval={"length_multipliers": [1, 2], "tasks": {"samples": 4}}, report=tmp / "report")


def passkey_config(tmp_path: Path) -> Path:
    """A tiny run config trained on passkey (4 steps, L = 32), its runs under tmp_path/runs."""
    config = tmp_path / "syn.yaml"
    config.write_text(f"""
name: syn
out_dir: {tmp_path / 'runs'}
model: {{d_model: 32, n_layers: 2, n_heads: 4}}
data: {{source: synthetic, tokenizer: {{kind: char}}, synthetic: {{tasks: [passkey]}}}}
train: {{seq_len: 32, batch_size: 8, max_steps: 4, warmup_steps: 1, eval_interval: 4, eval_batches: 1,
        ckpt_interval: 4}}
log: {{progress: false}}
""")
    return config


def recall_config(tmp: Path) -> Path:
    """A tiny run config trained on recall (3 pairs, L = 24, 16 steps), scored at 1× and 2× L."""
    path = tmp / "syn.yaml"
    path.write_text(f"""
name: syn
out_dir: {tmp / 'runs'}
model: {{d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2}}
data: {{source: synthetic, tokenizer: {{kind: char}}, synthetic: {{tasks: [recall], pairs: 3}}}}
train: {{seq_len: 24, batch_size: 8, max_steps: 16, lr: 3.0e-3, warmup_steps: 2, eval_interval: 8,
        eval_batches: 2, ckpt_interval: 4, log_interval: 1, seed: 3}}
eval: {{length_multipliers: [1, 2], tasks: {{samples: 6, depths: [0, 1]}}}}
log: {{progress: false}}
""")
    return path


def copy_runs(runs: Path, names: list[str], to: Path) -> list[Path]:
    """Private copies of shared runs (their evaluation caches included) under ``to``."""
    to.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copytree(runs / name, to / name)) for name in names]


def records(run_dir: Path, key: str = "loss") -> dict[int, float]:
    """Step -> the value of ``key`` in each record of the run's metrics.jsonl that has it."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r[key] for r in map(json.loads, lines) if key in r}


def stop_after(step: int, monkeypatch) -> None:
    """Make the trainer behave as if SIGTERM arrived during step ``step``."""
    original = Trainer.train_step

    def train_step(self):
        out = original(self)
        if self.step == step:
            self.stop_signal = signal.SIGTERM
        return out

    monkeypatch.setattr(Trainer, "train_step", train_step)


def tasks_cli(*args: str) -> subprocess.CompletedProcess:
    """``ropelab tasks ARGS`` (eval/tasks/exact_match.py) in a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "ropelab.eval.tasks.exact_match", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
