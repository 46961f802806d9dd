"""Hugging Face transformers directories: export a run, import one as a run, check parity.

An export (``export_run``) holds what ``AutoModelForCausalLM`` and ``AutoTokenizer`` read —
config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, special_tokens_map.json — plus ``ropelab.json``: the original
pairing, the full run config, the checkpoint's metadata and (byte/char) our tokenizer.
Importing our own export (``import_hf``) restores that run exactly; a directory without
ropelab.json, or whose config.json no longer matches it, is read as a foreign Llama
(half pairing, config from config.json, default data/train/eval settings).

Both directions write into a temporary sibling and rename it into place (common/atomic.py),
and neither writes into an existing non-empty directory. The mapping itself (names,
configs, q/k row order) is in model/llama_mapping.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ropelab.configs import config_from_dict, config_to_dict, save_config
from ropelab.configs.schema import DataConfig, RunConfig, TokenizerConfig, TrainConfig
from ropelab.common.atomic import atomic_directory
from ropelab.data.tokenizers import HF_TOKENIZER_FILES, load_hf_tokenizer, save_hf_tokenizer, tokenizer_from_json
from ropelab.model.config import ModelConfig, RopeScalingConfig
from ropelab.model.llama_mapping import (ARCH_KEYS, HFConversionError, check_exportable, from_hf_state, hf_config,
                                 hf_rope_settings, model_config_from_hf, to_hf_state)
from ropelab.model.transformer import Transformer
from ropelab.training.checkpoint import NonFiniteWeights, non_finite, save_checkpoint
from ropelab.training.memory import Estimate, check_fits, forward_estimate
from ropelab.training.run_dir import TOKENIZER, RunDir
from ropelab.training.saved_run import load_run, with_scaling

SIDE_FILE = "ropelab.json"
FORMAT = "ropelab-hf/1"
WEIGHTS = "model.safetensors"
# Everything an export writes (scripts/export_hf.py lists them; tests/unit/test_hf.py checks both).
EXPORT_FILES = ("config.json", "generation_config.json", WEIGHTS, *HF_TOKENIZER_FILES, SIDE_FILE)


def read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint, single file or sharded (index.json)."""
    index = hf_dir / f"{WEIGHTS}.index.json"
    if (hf_dir / WEIGHTS).is_file():
        files = [hf_dir / WEIGHTS]
    elif index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise HFConversionError(f"{index} has no weight_map; the sharded checkpoint is incomplete")
        files = sorted({hf_dir / f for f in weight_map.values()})
    elif list(hf_dir.glob("*.bin")):
        raise HFConversionError(f"{hf_dir} has only pickle (.bin) weights; ropelab reads safetensors only (no "
                                "code runs on load). Re-save it with transformers: "
                                "model.save_pretrained(DIR, safe_serialization=True)")
    else:
        raise HFConversionError(f"{hf_dir} has no weights ({WEIGHTS} or {WEIGHTS}.index.json)")
    tensors = {}
    for path in files:
        try:
            tensors.update(load_file(str(path)))
        except (SafetensorError, OSError) as e:
            raise HFConversionError(f"cannot read {path}: {e}") from None
    return tensors


# --------------------------------------------------------------------------- directories

def check_target(path: Path) -> None:
    """Refuse to write into an existing non-empty directory (nothing is overwritten)."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise HFConversionError(f"{path} already exists and is not empty; choose a new directory "
                                "(nothing was written)")


def read_json(path: Path) -> dict:
    """A JSON object from ``path``, or HFConversionError saying what is wrong with the file."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HFConversionError(f"{path.parent} is not a Hugging Face model directory (no {path.name})") from None
    except ValueError as e:
        raise HFConversionError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise HFConversionError(f"{path} is not a JSON object")
    return obj


def side_config(hf_dir: Path, hf: dict) -> Optional[tuple[object, dict]]:
    """(RunConfig, side file) from ropelab.json if it describes exactly this config.json, else None."""
    path = hf_dir / SIDE_FILE
    if not path.is_file():
        return None
    side = read_json(path)
    if side.get("format") != FORMAT or not isinstance(side.get("run_config"), dict):
        return None
    run_cfg = config_from_dict(side["run_config"])
    expected = hf_config(run_cfg.model, run_cfg.train.seq_len, 0)
    same = all(expected[k] == hf.get(k) for k in ARCH_KEYS) and hf_rope_settings(expected) == hf_rope_settings(hf)
    return (run_cfg, side) if same else None


# --------------------------------------------------------------------------- export / import

def _export_notes(cfg: ModelConfig, config: dict) -> list[str]:
    rope, notes = cfg.pos.rope, []
    if rope.pairing == "interleaved":
        notes.append("interleaved pairing: q_proj/k_proj rows reordered to transformers' half pairing (exact)")
    if rope.scaling.type == "ntk" and rope.scaling.factor != 1.0:
        notes.append("ntk scaling exported as plain RoPE with rope_theta = theta * s^(d/(d-2)) = "
                     f"{config['rope_theta']:.6g}")
    if rope.scaling.type == "dynamic" and rope.scaling.factor != 1.0:
        notes.append("dynamic NTK: a full forward agrees; generation differs (transformers refits the "
                     "frequencies to the current length at each step, ropelab once to prompt + max_new_tokens)")
    return notes


def export_run(run_dir: Path, out_dir: Path, which: str = "latest",
               scaling: Optional[RopeScalingConfig] = None) -> list[str]:
    """Write ``out_dir`` for ``AutoModelForCausalLM``/``AutoTokenizer``; returns notes for the user."""
    out_dir = Path(out_dir)
    check_target(out_dir)
    run = load_run(run_dir, which=which)
    check_exportable(run.cfg.model)  # before with_scaling, whose error would hide the real reason
    cfg = with_scaling(run.cfg, scaling)
    config = hf_config(cfg.model, cfg.train.seq_len, run.tokenizer.eot_id)
    notes = _export_notes(cfg.model, config)
    side = {"format": FORMAT, "pairing": cfg.model.pos.rope.pairing, "run_config": config_to_dict(cfg),
            "checkpoint": {**{k: v for k, v in run.meta.items() if k != "format"},
                           "exported_from": str(run.checkpoint)},
            # bpe is tokenizer.json itself; byte/char are restored from our own format
            "tokenizer": run.tokenizer.to_json() if run.tokenizer.kind in ("byte", "char") else None,
            "notes": notes}

    with atomic_directory(out_dir) as tmp:
        save_file(to_hf_state(run.model), str(tmp / WEIGHTS), metadata={"format": "pt"})
        save_hf_tokenizer(run.tokenizer, tmp, config["max_position_embeddings"])
        ids = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(ids, indent=2))
        (tmp / SIDE_FILE).write_text(json.dumps(side, indent=2, ensure_ascii=False), encoding="utf-8")
    return notes


def _run_for(hf_dir: Path, hf: dict):
    """(RunConfig, Tokenizer, checkpoint meta, notes) for an HF directory: ours restored, or foreign."""
    model_cfg, train_len = model_config_from_hf(hf, str(hf_dir / "config.json"))
    own = side_config(hf_dir, hf)
    if own is not None:
        run_cfg, side = own
        tokenizer = tokenizer_from_json(side["tokenizer"]) if side.get("tokenizer") else None
        meta = {k: v for k, v in side.get("checkpoint", {}).items() if k != "format"}
        notes = [f"ropelab export: original config restored ({run_cfg.model.pos.rope.pairing} pairing)"]
    else:
        # Its tokenizer cannot be retrained from a corpus: data.tokenizer uses the file as is
        # (import_hf points it at the run's tokenizer.json).
        data = DataConfig(tokenizer=TokenizerConfig(kind="file", path=TOKENIZER))
        run_cfg = RunConfig(model=model_cfg, data=data, train=TrainConfig(seq_len=train_len))
        tokenizer, meta = None, {}
        notes = [f"foreign Llama: half pairing, train.seq_len={train_len}, its own tokenizer "
                 "(data.tokenizer.kind=file); evaluation corpus: the built-in one until you set data.*"]
        if (hf_dir / SIDE_FILE).exists():
            notes.insert(0, f"{SIDE_FILE} does not describe this config.json (changed after export?); ignored")
    tokenizer = tokenizer or load_hf_tokenizer(hf_dir, hf.get("eos_token_id"))
    if tokenizer.vocab_size > run_cfg.model.vocab_size:
        raise HFConversionError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                                f"{run_cfg.model.vocab_size} embedding rows; they do not belong together")
    return run_cfg, tokenizer, meta, notes


def import_hf(hf_dir: Path, run_dir: Path) -> list[str]:
    """Write a ropelab run directory (config, tokenizer, checkpoint) for a transformers Llama."""
    hf_dir, run_dir = Path(hf_dir), Path(run_dir)
    check_target(run_dir)
    if not hf_dir.is_dir():
        raise HFConversionError(f"{hf_dir} is not a directory; give a Hugging Face model directory")
    run_cfg, tokenizer, meta, notes = _run_for(hf_dir, read_json(hf_dir / "config.json"))
    run_cfg = dataclasses.replace(run_cfg, name=run_dir.resolve().name, out_dir=str(run_dir.parent))
    if run_cfg.data.tokenizer.kind == "file":
        tok_cfg = dataclasses.replace(run_cfg.data.tokenizer, path=str(RunDir(run_dir.resolve()).tokenizer))
        run_cfg = dataclasses.replace(run_cfg, data=dataclasses.replace(run_cfg.data, tokenizer=tok_cfg))
    model = Transformer(run_cfg.model)
    state = from_hf_state(read_hf_weights(hf_dir), run_cfg.model, str(hf_dir))
    bad = non_finite(state)
    if bad:  # every command would refuse the run it became
        raise HFConversionError(f"{NonFiniteWeights(hf_dir, bad)}: nothing computed from them would mean anything, "
                                "so they are not imported")
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # shapes that disagree with config.json
        raise HFConversionError(f"the weights in {hf_dir} do not fit its config.json: "
                                f"{str(e).splitlines()[-1].strip()}") from None
    step = int(meta.pop("step", 0) or 0)
    meta = {**meta, "imported_from": str(hf_dir), "params": model.num_params()}

    with atomic_directory(run_dir) as tmp:
        run = RunDir(tmp)
        save_config(run_cfg, run.config)
        tokenizer.save(run.tokenizer)
        save_checkpoint(run, step, model, None, meta, keep_last=1)  # weights only: not resumable
    return notes


def check_parity_memory(cfg: RunConfig, length: Optional[int]) -> None:
    """Before anything is written: the memory of ``check_parity``'s two forwards at ``length``
    (ours, and transformers' whose eager attention holds every layer's (H, T, T) scores)."""
    length = length or 2 * cfg.train.seq_len
    ours = forward_estimate(cfg.model, 1, length, f"checking the export over {length:,} tokens", full_logits=True)
    scores = 2 * cfg.model.n_heads * length * length * 4.0
    check_fits(Estimate(ours.what, (*ours.parts, ("transformers' forward", ours.total + scores))), "cpu",
               "Check a shorter length (--check-length).")


def check_parity(run_dir: Path, out_dir: Path, which: str = "latest",
                 scaling: Optional[RopeScalingConfig] = None, length: Optional[int] = None) -> tuple[float, int]:
    """(max |logit difference|, tokens) between the run and transformers' load of its export."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise HFConversionError("checking needs transformers: pip install -e '.[hf]'") from None
    run = load_run(run_dir, which=which, scaling=scaling)
    length = length or 2 * run.cfg.train.seq_len  # beyond the training length, where RoPE matters most
    hf_model = AutoModelForCausalLM.from_pretrained(str(out_dir)).eval()  # float32, as config.json says
    tokens = torch.randint(0, run.cfg.model.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return float((run.model(tokens) - hf_model(tokens).logits).abs().max()), length
