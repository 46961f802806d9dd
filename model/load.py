"""Rebuild a trained model from its run directory alone (config, tokenizer, weights).

Evaluation and sampling never re-derive a config by hand: they read ``config.yaml``,
optionally swap in a RoPE scaling (inference-time, no retraining), and load weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from model.checkpoint import latest_checkpoint, load_weights, read_meta
from model.config import RopeScalingConfig
from model.errors import CheckpointError, ConfigError
from model.transformer import Transformer


@dataclass
class LoadedRun:
    run_dir: Path
    cfg: Any  # configs.schema.RunConfig
    model: Transformer
    tokenizer: Any  # data.tokenizers.Tokenizer
    checkpoint: Path
    meta: dict


def with_scaling(cfg, scaling: Optional[RopeScalingConfig]):
    """``cfg`` (a RunConfig) with model.pos.rope.scaling replaced; RoPE runs only."""
    if scaling is None:
        return cfg
    if cfg.model.pos.kind != "rope":
        if scaling.type == "none":
            return cfg
        raise ConfigError(f"RoPE scaling '{scaling.type}' needs a RoPE model; this run uses "
                          f"pos.kind={cfg.model.pos.kind}")
    pos = cfg.model.pos
    rope = dataclasses.replace(pos.rope, scaling=scaling)
    model_cfg = dataclasses.replace(cfg.model, pos=dataclasses.replace(pos, rope=rope))
    return dataclasses.replace(cfg, model=model_cfg)


def load_run(run_dir: str | Path, which: str = "latest", device: str | torch.device = "cpu",
             scaling: Optional[RopeScalingConfig] = None) -> LoadedRun:
    """The run's model in eval mode with ``which`` weights ("latest" or "best")."""
    from configs import load_config
    from data.tokenizers import load_tokenizer

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise CheckpointError(f"{run_dir} is not a run directory (no config.yaml); train one with "
                              "python train.py CONFIG name=...")
    cfg = with_scaling(load_config(run_dir / "config.yaml"), scaling)
    if which == "best":
        ckpt = run_dir / "best"
        if not ckpt.is_dir():
            raise CheckpointError(f"{run_dir} has no best/ checkpoint yet (no validation has run)")
    else:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise CheckpointError(f"{run_dir} has no checkpoint yet; train it first")
    meta = read_meta(ckpt)
    model = Transformer(cfg.model)
    load_weights(model, ckpt)
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    return LoadedRun(run_dir, cfg, model.to(device).eval(), tokenizer, ckpt, meta)


def rescaled(run: LoadedRun, scaling: RopeScalingConfig) -> Transformer:
    """The run's model with another RoPE scaling, built from the loaded weights (no disk I/O).

    Inverse frequencies are non-persistent buffers, so the state dict is the same.
    """
    cfg = with_scaling(run.cfg, scaling)
    if cfg is run.cfg:
        return run.model
    weight = run.model.tok_emb.weight
    model = Transformer(cfg.model).to(weight.device)
    model.load_state_dict(run.model.state_dict())
    return model.eval()
