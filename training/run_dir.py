"""The run directory: every path inside a run is named here and nowhere else.

    runs/<name>/
        config.yaml          the resolved RunConfig; rebuilds model and data exactly
        tokenizer.json       the run's own tokenizer (evaluation and sampling read it)
        metrics.jsonl        one JSON record per logged step and per validation
        train.log            output of a run launched by ropelab ablate
        run.lock             held (flock) by the process training into this directory
        wandb_id.txt, wandb/ the Weights & Biases run id (a resumed run continues it)
        checkpoints/step_000200/{model.safetensors, state.pt, meta.json}
        checkpoints/latest   the name of the newest complete checkpoint
        checkpoints/unreadable-step_000300/   a damaged checkpoint set aside on resume
        best/{model.safetensors, meta.json}
        eval/                cached evaluation results, one file per evaluation config
        eval/planned.yaml    the evaluation a grid planned for the run (ropelab ablate)

A checkpoint directory holds ``WEIGHTS`` (safetensors), ``STATE`` (optimizer, schedule,
RNG and sampler state; absent from best/ and imports) and ``META`` (step, tokens,
validation loss, commit). training/checkpoint.py reads and writes them.

Interrupted atomic writes (common/atomic.py) leave hidden ``.NAME.tmp-*`` siblings;
``leftovers`` lists them so a trainer holding the run's lock can remove them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # annotations only: the run directory does not depend on the config schema
    from ropelab.configs.schema import RunConfig

WEIGHTS, STATE, META = "model.safetensors", "state.pt", "meta.json"
TOKENIZER, METRICS = "tokenizer.json", "metrics.jsonl"


class RunDir:
    """The paths of one run directory (nothing is created by naming them)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    def of(cls, cfg: "RunConfig") -> "RunDir":
        """Where the run ``cfg`` describes lives: ``<out_dir>/<name>`` (the one place that says so)."""
        return cls(Path(cfg.out_dir) / cfg.name)

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
        return self.path / METRICS

    @property
    def log(self) -> Path:
        return self.path / "train.log"

    @property
    def lock(self) -> Path:
        return self.path / "run.lock"

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

    def unreadable(self, ckpt: Path) -> Path:
        """Where a damaged checkpoint is set aside (kept for inspection, never loaded)."""
        return self.checkpoints / f"unreadable-{ckpt.name}"

    def pointer_target(self) -> Optional[str]:
        """The checkpoint name ``latest`` holds, or None without a readable pointer."""
        try:
            return self.latest_pointer.read_text().strip() or None
        except (OSError, UnicodeDecodeError):
            return None

    def checkpoint_candidates(self) -> list[Path]:
        """Checkpoints to resume from, best first: the one ``latest`` names, then every
        other complete one, newest first (an earlier one stands in when a newer is damaged)."""
        complete = self.complete_checkpoints()[::-1]
        named = self.pointer_target()
        first = [p for p in complete if p.name == named]
        return first + [p for p in complete if p.name != named]

    def latest_checkpoint(self) -> Optional[Path]:
        """The newest checkpoint (the one ``latest`` names, else the newest complete one), or
        None when the run has none yet. Whether its files read is checked on loading
        (training/checkpoint.py: ``load_newest``)."""
        candidates = self.checkpoint_candidates()
        return candidates[0] if candidates else None

    def leftovers(self) -> list[Path]:
        """Temporary siblings of interrupted atomic writes in the run and its checkpoints."""
        return [p for d in (self.path, self.checkpoints, self.eval_dir)
                for pattern in (".*.tmp-*", ".*.old-*") for p in d.glob(pattern)]

    def remove_leftovers(self) -> None:
        """Remove ``leftovers`` (only while holding the run's lock: no write is in progress)."""
        for path in self.leftovers():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    # --- evaluation -----------------------------------------------------------------
    @property
    def eval_dir(self) -> Path:
        return self.path / "eval"

    def eval_cache(self, kind: str, key: str) -> Path:
        return self.eval_dir / f"{kind}-{key}.json"

    @property
    def planned_eval(self) -> Path:
        """The eval keys a grid planned for this run, as a YAML mapping (``--eval-file``)."""
        return self.eval_dir / "planned.yaml"

    # --- what it is -----------------------------------------------------------------
    def is_run(self) -> bool:
        return self.config.is_file()


def runs_in(out_dir: str | Path) -> list[str]:
    """Names of the run directories directly under ``out_dir`` (sorted)."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if p.is_dir() and RunDir(p).is_run())
