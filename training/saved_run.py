"""Rebuild a trained model from its run directory alone (config, tokenizer, weights).

Evaluation, sampling and export never re-derive a config by hand: they read the run's
config.yaml, optionally swap in a RoPE scaling (inference-time, no retraining), load the
weights, and use the run's own tokenizer.json.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ropelab.configs import load_config
from ropelab.configs.schema import RunConfig
from ropelab.data.tokenizers import Tokenizer, load_tokenizer
from ropelab.model.config import RopeScalingConfig
from ropelab.model.encodings import accepts_rope_scaling, kinds_where
from ropelab.common.errors import CheckpointError, ConfigError, DataError
from ropelab.model.transformer import Transformer
from ropelab.training.checkpoint import NonFiniteWeights, load_newest, load_weights, read_meta
from ropelab.training.consistency import check_parts
from ropelab.training.nonfinite import non_finite_checkpoint, retrain_advice
from ropelab.training.run_dir import RunDir
from ropelab.training.run_record import check_loadable


@dataclass
class SavedRun:
    run: RunDir
    cfg: RunConfig
    model: Transformer
    tokenizer: Tokenizer
    checkpoint: Path
    meta: dict

    @property
    def run_dir(self) -> Path:
        return self.run.path


def with_scaling(cfg: RunConfig, scaling: Optional[RopeScalingConfig]) -> RunConfig:
    """``cfg`` with its RoPE scaling replaced; for encodings that accept one only
    (model/encodings.py). In a layer plan only the full-attention layers whose encoding
    accepts one are extended: a sliding-window layer never meets a distance beyond its window,
    so its frequencies stay as trained (Gemma 3 extends its global layers only; OLMo 3's
    sliding layers given the scaling was a bug, transformers PR #45945)."""
    if scaling is None:
        return cfg
    model = cfg.model
    if model.layers.uniform:
        if not accepts_rope_scaling(model.pos.kind):
            if scaling.type == "none":
                return cfg
            raise ConfigError(f"RoPE scaling '{scaling.type}' needs a model with a rotation (pos.kind="
                              f"{' or '.join(kinds_where('rope_scaling'))}); this run uses pos.kind={model.pos.kind}")
        return dataclasses.replace(cfg, model=dataclasses.replace(model, pos=_scaled(model.pos, scaling)))
    types = {name: dataclasses.replace(layer, pos=_scaled(layer.pos, scaling))
             if layer.window is None and accepts_rope_scaling(layer.pos.kind) else layer
             for name, layer in model.layers.types.items()}
    if types == model.layers.types:
        if scaling.type == "none":
            return cfg
        raise ConfigError(f"RoPE scaling '{scaling.type}' extends full-attention rotary layers, and this run's layer "
                          f"plan ({model.layers.pattern}) has none: its rotary layers are sliding-window ones")
    plan = dataclasses.replace(model.layers, types=types)
    return dataclasses.replace(cfg, model=dataclasses.replace(model, layers=plan))


def _scaled(pos, scaling: RopeScalingConfig):
    return dataclasses.replace(pos, rope=dataclasses.replace(pos.rope, scaling=scaling))


def read_run_config(run: RunDir) -> RunConfig:
    if run.path.is_file():
        raise CheckpointError(f"{run.path} is a file; give the run directory that holds it "
                              f"({run.path.parent} if it is that run's {run.path.name})")
    if not run.is_run():
        raise CheckpointError(f"{run} is not a run directory (no {run.config.name}); train one with "
                              "python train.py CONFIG name=...")
    return load_config(run.config)


def load_run(run_dir: str | Path, which: str = "latest", device: str | torch.device = "cpu",
             scaling: Optional[RopeScalingConfig] = None, step: Optional[int] = None) -> SavedRun:
    """The run's model in eval mode with ``which`` weights ("latest" or "best"), or the
    checkpoint of training step ``step``; refused when its weights are not finite, or when
    its config.yaml or tokenizer.json is not what they were trained with
    (training/consistency.py)."""
    run = RunDir(run_dir)
    trained = read_run_config(run)
    check_loadable(run)  # a record without weights has none to load
    cfg = with_scaling(trained, scaling)
    tokenizer = run_tokenizer(run, cfg)
    model = Transformer(cfg.model)

    def load(ckpt: Path) -> dict:
        meta = read_meta(ckpt)
        check_parts(run, trained, ckpt, meta)
        load_weights(model, ckpt)
        return meta

    try:
        if step is not None or which == "best":
            ckpt = _chosen_checkpoint(run, step)
            meta = load(ckpt)
        else:
            found = load_newest(run, load, advice=f"Train it again: {retrain_advice(run)}")
            if found is None:
                raise CheckpointError(f"{run} has no checkpoint yet; train it first")
            ckpt, meta, _ = found
    except NonFiniteWeights as e:
        raise non_finite_checkpoint(e, run, trained) from None
    return SavedRun(run, cfg, model.to(device).eval(), tokenizer, ckpt, meta)


def _chosen_checkpoint(run: RunDir, step: Optional[int]) -> Path:
    """The checkpoint of training step ``step``, or best/ when ``step`` is None."""
    if step is not None:
        ckpt = run.step_dir(step)
        if not ckpt.is_dir():
            kept = ", ".join(str(int(p.name.split("_")[1])) for p in run.complete_checkpoints()) or "none"
            raise CheckpointError(f"{run} has no checkpoint of step {step} (it keeps steps: {kept}); raise "
                                  "train.keep_last before training to keep more")
        return ckpt
    if not run.best.is_dir():
        validated = [meta for meta in _metas(run) if meta.get("val_loss") is not None]
        if not validated:
            raise CheckpointError(f"{run} has no best/ checkpoint yet (no validation has run); use its latest "
                                  "weights (--which latest, or init.which=latest)")
        raise CheckpointError(f"{run} has no best/ checkpoint, although validation has run (val loss "
                              f"{validated[-1]['val_loss']:.4f} at step {validated[-1].get('step')}): best/ was "
                              f"deleted or moved after training. Use its latest weights (--which latest, or "
                              "init.which=latest), or move best/ back")
    return run.best


def _metas(run: RunDir) -> list[dict]:
    """The readable meta.json of every complete checkpoint, oldest first."""
    out = []
    for ckpt in run.complete_checkpoints():
        try:
            out.append(read_meta(ckpt))
        except CheckpointError:
            continue
    return out


def run_tokenizer(run: RunDir, cfg: RunConfig) -> Tokenizer:
    """The run's own tokenizer.json, checked against the vocabulary its model was trained with."""
    path = run.tokenizer
    if not path.is_file():
        raise CheckpointError(f"{run} has no {path.name}; copy the tokenizer of the data it was trained on "
                              f"there (the prepared data directory under data.cache_dir holds it)")
    try:
        tokenizer = load_tokenizer(path)
    except DataError as e:
        raise CheckpointError(f"{e}; restore the run's own tokenizer.json (its prepared data directory "
                              "under data.cache_dir holds a copy)") from None
    # An imported model may have more embedding rows than its tokenizer has tokens.
    fits = (tokenizer.vocab_size <= cfg.model.vocab_size if cfg.data.tokenizer.kind == "file"
            else tokenizer.vocab_size == cfg.model.vocab_size)
    if not fits:
        raise CheckpointError(f"{path} does not belong to this run: it has {tokenizer.vocab_size} tokens, the "
                              f"model was trained with {cfg.model.vocab_size}; restore the run's own tokenizer.json "
                              "(its prepared data directory under data.cache_dir holds a copy)")
    return tokenizer


def checked_tokenizer(run: RunDir, cfg: RunConfig) -> Tokenizer:
    """The run's tokenizer.json, checked against its model's vocabulary and, with its
    config.yaml, against what its newest checkpoint recorded (training/consistency.py),
    without loading any weights."""
    tokenizer = run_tokenizer(run, cfg)
    ckpt = run.latest_checkpoint()
    if ckpt is not None:
        try:
            meta = read_meta(ckpt)
        except CheckpointError:
            return tokenizer  # said by whatever loads the checkpoint
        check_parts(run, cfg, ckpt, meta)
    return tokenizer


def rescaled(saved: SavedRun, scaling: RopeScalingConfig) -> Transformer:
    """The run's model with another RoPE scaling, built from the loaded weights (no disk I/O).

    Inverse frequencies are non-persistent buffers, so the state dict is the same.
    """
    cfg = with_scaling(saved.cfg, scaling)
    if cfg is saved.cfg:
        return saved.model
    weight = saved.model.tok_emb.weight
    model = Transformer(cfg.model).to(weight.device)
    model.load_state_dict(saved.model.state_dict())
    return model.eval()
