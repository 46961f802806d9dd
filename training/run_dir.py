"""The run directory: every path inside a run is named here and nowhere else.

    runs/<name>/
        config.yaml          the resolved RunConfig; rebuilds model and data exactly
        tokenizer.json       the run's own tokenizer (evaluation and sampling read it)
        metrics.jsonl        one JSON record per logged step and per validation
        train.log            output of a run launched by scripts/ablate.py
        wandb_id.txt, wandb/ the Weights & Biases run id (a resumed run continues it)
        checkpoints/step_000200/{model.safetensors, state.pt, meta.json}
        checkpoints/latest   the name of the newest complete checkpoint
        best/{model.safetensors, meta.json}
        eval/                cached evaluation results, one file per evaluation config

A checkpoint directory holds ``WEIGHTS`` (safetensors), ``STATE`` (optimizer, schedule,
RNG and sampler state; absent from best/ and imports) and ``META`` (step, tokens,
validation loss, commit). training/checkpoint.py reads and writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from model.errors import CheckpointError

WEIGHTS, STATE, META = "model.safetensors", "state.pt", "meta.json"
TOKENIZER = "tokenizer.json"


class RunDir:
    """The paths of one run directory (nothing is created by naming them)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # --- files --------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def tokenizer(self) -> Path:
        return self.path / TOKENIZER

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def log(self) -> Path:
        return self.path / "train.log"

    @property
    def wandb_id(self) -> Path:
        return self.path / "wandb_id.txt"

    @property
    def wandb_dir(self) -> Path:
        """The directory handed to ``wandb.init(dir=…)``; wandb adds its own ``wandb/``."""
        return self.path

    # --- checkpoints ----------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def latest_pointer(self) -> Path:
        return self.checkpoints / "latest"

    @property
    def best(self) -> Path:
        return self.path / "best"

    def step_dir(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    def complete_checkpoints(self) -> list[Path]:
        """Step directories whose metadata was written (the last file of a checkpoint), oldest first."""
        return sorted(p for p in self.checkpoints.glob("step_*") if (p / META).exists())

    def latest_checkpoint(self) -> Optional[Path]:
        """The checkpoint ``latest`` names, or None when the run has none yet."""
        pointer = self.latest_pointer
        if not pointer.exists():
            return None
        path = self.checkpoints / pointer.read_text().strip()
        if not path.is_dir():
            raise CheckpointError(f"{pointer} names {path.name}, which does not exist; delete {pointer} "
                                  "to start over or restore the checkpoint directory")
        return path

    # --- evaluation -----------------------------------------------------------------
    def eval_cache(self, kind: str, key: str) -> Path:
        return self.path / "eval" / f"{kind}-{key}.json"

    # --- what it is -----------------------------------------------------------------
    def is_run(self) -> bool:
        return self.config.is_file()
