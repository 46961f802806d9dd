"""What must agree before a run is loaded or continued: its parts, and the schedule it was planned for.

A run directory's parts are written at different times and can be edited or swapped
afterwards: config.yaml (rewritten by each training session), tokenizer.json, the
checkpoints' weights. Every checkpoint's meta.json therefore records, at training time,
fingerprints of the other two: ``tokenizer_sha256`` (of tokenizer.json's bytes) and
``experiment`` (the config's keys that define the experiment, configs/experiment.py). A
run is loaded (evaluation, sampling, export, a parent) or resumed only while they agree: a
tokenizer swapped for another of the same size, or a config.yaml edited after training
(``model.pos.kind`` changed from rope to alibi loads the same weights without a murmur), is
refused with the difference named. Keys the schema gained since a checkpoint was written
are not compared; checkpoints written before the fingerprints existed carry none and load
without the check.

A resumed run also keeps the learning-rate schedule it was planned for: meta.json records
``total_steps``, and resuming an unfinished run with fewer steps would cut its cosine decay
short mid-run, so it is refused; more steps (extending a run, as a grid that raises
``train.max_steps`` does) re-plan it from the current step, and the trainer says so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

from ropelab.common.errors import CheckpointError, UserError
from ropelab.common.logs import get_logger
from ropelab.configs.experiment import experiment_identity
from ropelab.configs.schema import RunConfig
from ropelab.data.prepare import cache_root
from ropelab.training.run_dir import RunDir

logger = get_logger(__name__)

TOKENIZER_KEY, EXPERIMENT_KEY = "tokenizer_sha256", "experiment"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _identity(cfg: RunConfig) -> dict:
    """The experiment's keys as meta.json holds them (a JSON round trip: tuples become lists)."""
    return json.loads(json.dumps(experiment_identity(cfg), default=str))


def fingerprints(cfg: RunConfig, tokenizer_json: str) -> dict:
    """What every checkpoint of a run records about its config and its tokenizer.json."""
    return {TOKENIZER_KEY: sha256(tokenizer_json.encode("utf-8")), EXPERIMENT_KEY: _identity(cfg)}


def config_changes(cfg: RunConfig, meta: dict) -> list[str]:
    """"key: X in training, Y now" for each experiment key both sides hold and that differs."""
    recorded = meta.get(EXPERIMENT_KEY)
    if not isinstance(recorded, dict):
        return []
    now = _identity(cfg)
    return [f"{key}: {recorded[key]!r} in training, {now[key]!r} now"
            for key in sorted(set(recorded) & set(now)) if recorded[key] != now[key]]


def _tokenizer_copy(cfg: RunConfig, digest: str) -> Optional[Path]:
    """A tokenizer.json with this digest among the run's prepared data directories, or None."""
    root = cache_root(cfg.data)
    for path in sorted(root.glob("*/tokenizer.json")) if root.is_dir() else ():
        try:
            if sha256(path.read_bytes()) == digest:
                return path
        except OSError:
            continue
    return None


def check_parts(run: RunDir, cfg: RunConfig, ckpt: Path, meta: dict) -> None:
    """Refuse a run whose config.yaml or tokenizer.json is not what ``ckpt`` was trained with."""
    changes = config_changes(cfg, meta)
    if changes:
        raise CheckpointError(f"{run.config} does not match the config {ckpt.name} was trained with ("
                              f"{'; '.join(changes[:5])}): it was edited after training. Put those values back in "
                              f"{run.config}; to train with the new ones, start a new run with name=...")
    digest = meta.get(TOKENIZER_KEY)
    if digest is None or not run.tokenizer.is_file() or sha256(run.tokenizer.read_bytes()) == digest:
        return
    copy = _tokenizer_copy(cfg, digest)
    fix = (f"restore it: cp {copy} {run.tokenizer}" if copy is not None else
           "restore the run's own tokenizer.json (the prepared data directory of its data under "
           f"{cache_root(cfg.data)} holds a copy once the data is prepared again)")
    raise CheckpointError(f"{run.tokenizer} is not the tokenizer {run} was trained with (its sha256 is "
                          f"{sha256(run.tokenizer.read_bytes())[:12]}…, {ckpt.name} recorded {digest[:12]}…): it "
                          f"was replaced after training; {fix}")


def check_continuation(run: RunDir, ckpt: Path, meta: dict, cfg: RunConfig, tokenizer_json: str,
                       total_steps: int) -> None:
    """Before a run resumes from ``ckpt``: the same config and tokenizer as it was trained
    with, and no schedule cut short (see the module docstring); a note says when the
    schedule is re-planned for more steps."""
    changes = config_changes(cfg, meta)
    if changes:
        raise UserError(f"cannot resume {run}: {ckpt.name} was trained with other settings than this command "
                        f"gives ({'; '.join(changes[:5])}); {run.config} was edited since. Resume with the settings "
                        "it was trained with, or start a new run with another name=...")
    digest = meta.get(TOKENIZER_KEY)
    if digest is not None and digest != sha256(tokenizer_json.encode("utf-8")):
        raise UserError(f"cannot resume {run}: the run's data now gives another tokenizer than {ckpt.name} was "
                        "trained with (its corpus or tokenizer settings changed since), so token ids would change "
                        "meaning mid-run; restore the data it was trained on, or start a new run with another name=...")
    planned, step = meta.get("total_steps"), int(meta.get("step", 0))
    if planned is None or planned == total_steps:
        return
    if total_steps < planned and step < planned:
        raise UserError(f"cannot resume {run} for {total_steps} steps: it was planned for {planned} (its learning "
                        f"rate decays over them) and is at step {step}, so fewer would cut the schedule short "
                        f"mid-run. Resume with train.max_steps={planned} (or the max_tokens that gives it); to "
                        "train fewer steps, start a new run with another name=...")
    if total_steps > planned:
        logger.warning(f"note: {run} was planned for {planned} steps and now trains for {total_steps}: its "
                       f"learning-rate schedule is re-planned from step {step} on")
