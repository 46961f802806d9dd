"""Starting a run from a trained one (``init.run``): the checks, and the weights to load.

A fine-tuned run keeps its parent's architecture (every model key but the RoPE scaling,
which is what context extension changes) and its tokenizer, starts from the parent's
weights with a fresh optimizer and schedule, and records where it came from.

A text parent that learned retrieval tasks in the task wording (``data.mix``) passes them
on: its children, fine-tuned on text alone, are scored on those tasks in that wording
(``learned_wording``), so they must keep the parent's ``data.synthetic`` settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ropelab.configs import config_to_dict
from ropelab.configs.experiment import seed_group
from ropelab.configs.schema import RunConfig
from ropelab.data.tokenizers import Tokenizer
from ropelab.common.errors import CheckpointError, ConfigError
from ropelab.training.run_dir import RunDir
from ropelab.training.saved_run import SavedRun, load_run

# Model keys a child may change: the scaling is the point of context extension.
MAY_CHANGE = ("pos.rope.scaling.",)


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def load_parent(cfg: RunConfig, tokenizer: Tokenizer) -> SavedRun:
    """The parent run of ``cfg.init``, checked against the new run before anything is written."""
    parent_dir = Path(cfg.init.run)
    if not RunDir(parent_dir).is_run():
        siblings = sorted(p.name for p in parent_dir.parent.glob("*") if RunDir(p).is_run())[:10]
        hint = f" Runs in {parent_dir.parent}: {', '.join(siblings)}." if siblings else ""
        raise ConfigError(f"init.run={cfg.init.run} is not a run directory (no config.yaml).{hint}")
    try:
        parent = load_run(parent_dir, which=cfg.init.which, step=cfg.init.step)
    except CheckpointError as e:
        raise CheckpointError(f"init.run={cfg.init.run}: {e}") from None
    if cfg.init.step is None and not parent.meta.get("finished", True):
        raise CheckpointError(f"init.run={cfg.init.run} has not finished training (its latest checkpoint is step "
                              f"{parent.meta.get('step')} of {parent.meta.get('total_steps')}); finish it first "
                              "(python train.py CONFIG --resume), or start from that checkpoint as it is with "
                              f"init.step={parent.meta.get('step')}")
    if parent.tokenizer != tokenizer:
        raise ConfigError(f"init.run={cfg.init.run} was trained with another tokenizer than this run's data "
                          "gives; use the parent's data settings (data.*) so the token ids mean the same")
    ours, theirs = _flat(config_to_dict(cfg)["model"]), _flat(config_to_dict(parent.cfg)["model"])
    differ = sorted(k for k in set(ours) | set(theirs)
                    if ours.get(k) != theirs.get(k) and not k.startswith(MAY_CHANGE))
    if differ:
        details = ", ".join(f"model.{k}: {theirs.get(k)!r} in the parent, {ours.get(k)!r} here" for k in differ[:5])
        raise ConfigError(f"init.run={cfg.init.run} has another architecture ({details}); a run can only start "
                          "from a parent of the same architecture (only model.pos.rope.scaling may change)")
    if learned_wording(parent.cfg, parent.meta.get("parent")) and cfg.data.synthetic != parent.cfg.data.synthetic:
        raise ConfigError(f"init.run={cfg.init.run} learned its retrieval tasks with other data.synthetic settings "
                          f"({parent.cfg.data.synthetic}) than this run's ({cfg.data.synthetic}); its fine-tunes are "
                          "scored on those tasks as the parent learned them: use the parent's data.synthetic")
    return parent


def learned_wording(cfg: RunConfig, parent: Optional[dict]) -> list[str]:
    """The retrieval tasks a text run learned in the task wording: those its ``data.mix``
    trains on, else those its parent did (``parent``: the record in its checkpoints' meta)."""
    return list(cfg.data.mix.tasks) or list((parent or {}).get("mix") or [])


def parent_record(parent: SavedRun) -> dict:
    """What a child's checkpoints say about where its starting weights came from; ``group``:
    the parent's experiment apart from its seed (configs/experiment.py), so fine-tunes of
    parents that differ only in their seed pool as seeds of one row (eval/core/evaluation.py)."""
    return {"run": str(parent.run_dir), "checkpoint": parent.checkpoint.name, "step": parent.meta.get("step"),
            "tokens": parent.meta.get("tokens"), "git_commit": parent.meta.get("git_commit"),
            "train_len": parent.cfg.train.seq_len, "group": seed_group(parent.cfg),
            **({"mix": mix} if (mix := learned_wording(parent.cfg, parent.meta.get("parent"))) else {})}
