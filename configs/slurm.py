"""A grid's Slurm resources: the ``slurm:`` section of a grid file, per run.

    slurm:
      partition: gpu        # sbatch --partition (default: the cluster's default partition)
      gpus_per_run: 2       # GPUs of one run; more than one: torchrun, one process per GPU
      nodes: 1              # nodes of one run (gpus_per_run is split evenly over them)
      cpus_per_run: 16      # --cpus-per-task, also the run's CPU threads
      mem: 64G              # --mem, per node
      time: "4:00:00"       # --time of a training job: minutes, or [D-]HH:MM:SS
      eval_time: 60         # --time of an evaluation job (default: time)
      account: my-lab       # --account
      constraint: h100      # --constraint
      sbatch: {qos: high}   # any other sbatch option, as --KEY=VALUE

``ropelab ablate GRID --launcher slurm --slurm time=8:00:00 sbatch.qos=low`` overrides
keys for one submission. ``gpus_per_run`` and ``time`` must be given (in the file or on
the command line): a cluster's defaults for them differ too much to guess.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ropelab.common.errors import ConfigError

REQUIRED = ("gpus_per_run", "time")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+(?::\d+){0,2})$")  # Slurm's time formats, see minutes()
_MEM = re.compile(r"^\d+[KMGT]?$")
EXAMPLE = "slurm: {gpus_per_run: 1, cpus_per_run: 8, mem: 32G, time: \"4:00:00\", partition: gpu}"


def minutes(text: str, key: str) -> int:
    """A Slurm time limit in whole minutes (seconds round up), read as sbatch reads it:
    ``90`` and ``"90:30"`` are minutes[:seconds], ``"4:00:00"`` hours, ``"1-12"`` days-hours."""
    match = _TIME.match(text.strip())
    parts = [int(p) for p in match.group(2).split(":")] if match else []
    if not match:
        raise ConfigError(f"slurm.{key}={text!r} is not a time limit; give minutes (e.g. 90) or "
                          "[D-]HH:MM:SS (e.g. \"4:00:00\")")
    if match.group(1) is not None:  # D-H, D-H:M, D-H:M:S
        hours, mins, secs = (parts + [0, 0])[:3]
        total = int(match.group(1)) * 1440 + hours * 60 + mins + (secs > 0)
    elif len(parts) == 3:  # H:M:S
        total = parts[0] * 60 + parts[1] + (parts[2] > 0)
    else:  # M or M:S, as sbatch reads them
        total = parts[0] + (len(parts) == 2 and parts[1] > 0)
    if total < 1:
        raise ConfigError(f"slurm.{key}={text!r}: a job needs at least one minute")
    return total


@dataclass(frozen=True)
class SlurmConfig:
    """What one run of a grid asks Slurm for (see the module doc)."""

    partition: Optional[str] = None
    gpus_per_run: Optional[int] = None
    nodes: int = 1
    cpus_per_run: Optional[int] = None
    mem: Optional[str] = None
    time: Optional[str] = None
    eval_time: Optional[str] = None
    account: Optional[str] = None
    constraint: Optional[str] = None
    sbatch: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.gpus_per_run is not None and self.gpus_per_run % self.nodes:
            raise ConfigError(f"slurm.gpus_per_run={self.gpus_per_run} does not split evenly over "
                              f"slurm.nodes={self.nodes}; give a multiple of the node count")
        for key in ("time", "eval_time"):
            if getattr(self, key) is not None:
                minutes(getattr(self, key), key)
        if self.mem is not None and not _MEM.match(self.mem):
            raise ConfigError(f"slurm.mem={self.mem!r} is not a Slurm memory size; give e.g. 64G or 32000M")

    @property
    def gpus_per_node(self) -> int:
        return (self.gpus_per_run or 0) // self.nodes

    def missing(self) -> list[str]:
        """The keys a submission needs that are not set."""
        return [key for key in REQUIRED if getattr(self, key) is None]

    def with_overrides(self, tree: dict, origin: str) -> "SlurmConfig":
        """This config with the keys of ``tree`` (a ``slurm:`` mapping) replaced; ``sbatch``
        options are merged key by key."""
        merged = dataclasses.asdict(self)
        for key, value in (tree or {}).items():
            if key == "sbatch" and isinstance(value, dict):
                merged["sbatch"] = {**merged["sbatch"], **value}
            else:
                merged[key] = value
        return slurm_config(merged, origin)


_INT_KEYS = {"gpus_per_run": 0, "nodes": 1, "cpus_per_run": 1}  # key -> smallest value
_TEXT_KEYS = ("partition", "mem", "time", "eval_time", "account", "constraint")


def slurm_config(tree: Any, origin: str) -> SlurmConfig:
    """A ``slurm:`` mapping checked key by key: unknown keys get the closest valid one, and
    numbers written for times or memory (``time: 90``) are read as Slurm would."""
    if not isinstance(tree, dict):
        raise ConfigError(f"{origin}: 'slurm' must be a mapping, e.g. {EXAMPLE}")
    valid = [f.name for f in dataclasses.fields(SlurmConfig)]
    values: dict[str, Any] = {}
    for key, value in tree.items():
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"did you mean 'slurm.{close[0]}'?" if close else f"valid keys: {', '.join(valid)}"
            raise ConfigError(f"{origin}: unknown key 'slurm.{key}'; {hint}")
        if value is None:
            continue
        if key in _INT_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < _INT_KEYS[key]:
                raise ConfigError(f"{origin}: slurm.{key} must be an integer >= {_INT_KEYS[key]}, got {value!r}")
        elif key in _TEXT_KEYS:
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise ConfigError(f"{origin}: slurm.{key} must be a string, got {value!r}")
            value = str(value)
        elif key == "sbatch":
            value = _sbatch_options(value, origin)
        values[key] = value
    try:
        return SlurmConfig(**values)
    except ConfigError as e:
        raise ConfigError(f"{origin}: {e}") from None


def _sbatch_options(value: Any, origin: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in value.items()):
        raise ConfigError(f"{origin}: slurm.sbatch must map sbatch option names to values, "
                          "e.g. {qos: high, mail-type: END}")
    return {k.lstrip("-"): v for k, v in value.items()}
