"""Ablation grids: a base run config, axes to sweep, and how to evaluate the result.

A grid file (``configs/ablations/*.yaml``) may ``inherit`` like any config; ``base`` is
resolved relative to the file that sets it::

    name: pe-extrapolation-cpu         # runs go to <out_dir>/<name>/, the report to reports/<name>/
    base: ../wikitext2-cpu.yaml
    overrides: [train.max_steps=1000]  # applied to every run
    variants:                          # optional named rows, each crossed with the axes
      linear-rope: [model.attention=linear, model.pos.kind=rope]
    axes:                              # dotted key -> values; the grid is their product
      model.pos.kind: [rope, sinusoidal, learned, alibi, none]
      train.seed: [0, 1]
    eval: {lengths: [64, 128, 2048], protocols: [nonoverlap, sliding], scalings: [none, yarn]}
    slurm: {gpus_per_run: 1, time: "4:00:00", partition: gpu}   # optional: configs/slurm.py

``eval`` holds keys of the runs' ``EvalConfig``: it is checked like any config section
when the grid loads and becomes ``eval.*`` overrides of every run, so each planned run's
``cfg.eval`` is what the grid evaluates it with. Every planned run is built and validated
(``load_config``) before anything trains, so a typo in an axis fails at once, naming the key.
``slurm`` holds what each run asks a cluster for (``--launcher slurm``; configs/slurm.py).
``archive`` names a directory where each run, once trained and evaluated, is kept as a
record without weights (training/run_record.py), e.g. in the repository, so that a grid
carries over to a fresh clone on another machine (grid/archive.py);
``archive_weights: true`` keeps the final weights in each record too, for a grid whose
runs other grids fine-tune from (``init.run``).
``exclude`` leaves runs of the product out (patterns on run names or rows), for a variant
that means something with some values of an axis only.

A grid that contradicts itself is refused when it is planned, naming the contradiction: an
axis that lists a value twice, an override (``overrides``, a variant, ``--set``) of a key an
axis sets for every run after it (so it would never be used), two runs that get one name,
and two runs that would train the same experiment (configs/experiment.py: variants that
differ only in evaluation settings, values that resolve alike such as 1 and 1.0). Each of
them would train one run twice, or count one run as two seeds in the report.
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Optional

from ropelab.configs.experiment import MAY_DIFFER, experiment_identity
from ropelab.configs.loader import load_config, load_config_tree, override_section
from ropelab.configs.schema import EvalConfig, RunConfig
from ropelab.configs.slurm import SlurmConfig, slurm_config
from ropelab.common.errors import ConfigError


@dataclass
class PlannedRun:
    name: str
    overrides: list[str]  # everything beyond the base file, as train.py arguments
    cfg: RunConfig  # its run directory: training.run_dir.RunDir.of(cfg)


@dataclass
class Grid:
    name: str
    base: Path
    out_dir: str = "runs"
    overrides: list[str] = field(default_factory=list)
    axes: dict[str, list[Any]] = field(default_factory=dict)
    # Named rows that are not a product of values (attention kind with an encoding, an
    # option of one encoding): name -> overrides, crossed with the axes.
    variants: dict[str, list[str]] = field(default_factory=dict)
    eval_overrides: list[str] = field(default_factory=list)  # the grid's eval section, as eval.* overrides
    report: Optional[str] = None
    # Where each finished, evaluated run's record (no weights) is kept, e.g. in the repository,
    # and restored from on another machine (grid/archive.py); None: not kept.
    archive: Optional[str] = None
    # Whether the records keep the final checkpoint's weights (for parents that other grids
    # fine-tune from with init.run); they cost the repository 4 bytes a parameter.
    archive_weights: bool = False
    slurm: Optional[SlurmConfig] = None  # None: the file has no slurm section
    source: Optional[Path] = None
    # Seeds added to chosen rows only: row (a run's name without its seed part) -> seeds,
    # e.g. {alibi: [3, 4]} where the comparisons of that row need more training runs.
    more_seeds: dict[str, list[int]] = field(default_factory=dict)
    # Runs of the product the grid leaves out: patterns (fnmatch) on a run's name or its row,
    # e.g. a layer plan that is a variant of its own crossed with a kind axis only where it means
    # something (``*-gemma3_kind-[!r]*``). Each pattern must leave out at least one run.
    exclude: list[str] = field(default_factory=list)

    @property
    def runs_dir(self) -> Path:
        """Where the grid's run directories live: ``<out_dir>/<name>``."""
        return Path(self.out_dir) / self.name

    @property
    def report_dir(self) -> Path:
        return Path(self.report or f"reports/{self.name}")

    def plan(self, extra_overrides: list[str] = ()) -> list[PlannedRun]:
        """Every run of the grid, validated: variants in order, each crossed with the axes
        (the last axis varies fastest)."""
        keys = list(self.axes)
        self._check_overrides(list(extra_overrides))
        runs = []
        for variant, values in itertools.product(self.variants or {None: []}, itertools.product(
                *(self.axes[k] for k in keys))):
            parts = ([variant] if variant else []) + [f"{k.split('.')[-1]}-{_name_part(v)}" for k, v in zip(keys, values)]
            name = "_".join(parts) or "run"
            overrides = [*self.overrides, *self.eval_overrides, *self.variants.get(variant, []), *extra_overrides,
                         *(f"{k}={_text(v)}" for k, v in zip(keys, values)),
                         f"out_dir={Path(self.out_dir) / self.name}", f"name={name}"]
            try:
                cfg = load_config(self.base, overrides)
            except ConfigError as e:
                raise ConfigError(f"{self.source}: run {name}: {e}") from None
            runs.append(PlannedRun(name, overrides, cfg))
        runs = self._excluded(runs)
        runs += self._more_seeds(runs)
        self._check_distinct(runs)
        return runs

    def _excluded(self, runs: list[PlannedRun]) -> list[PlannedRun]:
        """``runs`` without those ``exclude`` names; a pattern that leaves out nothing is refused."""
        def hit(pattern: str, run: PlannedRun) -> bool:
            return fnmatch.fnmatchcase(run.name, pattern) or fnmatch.fnmatchcase(row_of(run.name), pattern)
        idle = [p for p in self.exclude if not any(hit(p, run) for run in runs)]
        if idle:
            raise ConfigError(f"{self.source}: exclude {', '.join(map(repr, idle))} matches no run of the grid "
                              f"(its rows are {', '.join(dict.fromkeys(row_of(r.name) for r in runs))}); "
                              "fix the pattern or remove it")
        kept = [run for run in runs if not any(hit(p, run) for p in self.exclude)]
        if not kept:
            raise ConfigError(f"{self.source}: exclude leaves out every run of the grid; narrow its patterns")
        return kept

    def _more_seeds(self, runs: list[PlannedRun]) -> list[PlannedRun]:
        """The runs ``more_seeds`` adds: each a copy of its row's first run with another seed."""
        rows = {}
        for run in runs:
            rows.setdefault(row_of(run.name), run)
        added = []
        for row, seeds in self.more_seeds.items():
            if row not in rows:
                raise ConfigError(f"{self.source}: more_seeds names the row {row!r}, which the grid does not have; "
                                  f"its rows are {', '.join(sorted(rows))}")
            template = rows[row]
            has = sorted({r.cfg.train.seed for r in runs if row_of(r.name) == row})
            if set(seeds) & set(has) or len(set(seeds)) < len(seeds):
                raise ConfigError(f"{self.source}: more_seeds gives the row {row!r} seeds {seeds}, but it already has "
                                  f"seeds {has} (or names one twice): each seed is one training run; give new ones")
            for seed in seeds:
                name = f"{row}_seed-{seed}" if row != "run" else f"seed-{seed}"
                overrides = [o for o in template.overrides if not o.startswith(("train.seed=", "name="))]
                overrides += [f"train.seed={seed}", f"name={name}"]
                added.append(PlannedRun(name, overrides, load_config(self.base, overrides)))
        return added

    def _check_overrides(self, extra: list[str]) -> None:
        """Refuse an override of a key that an axis sets after it, for every run."""
        sources = [("overrides", self.overrides), *((f"variant {v}", o) for v, o in self.variants.items()),
                   ("--set", extra)]
        for source, overrides in sources:
            for text in overrides:
                key = text.partition("=")[0].strip()
                axis = next((a for a in self.axes if key == a or key.startswith(a + ".")), None)
                if axis is not None:
                    raise ConfigError(f"{self.source}: {source} sets {text}, but the axis {axis} sets it for every "
                                      "run after the overrides, so that value is never used; remove it, or the "
                                      "value from the axis")

    def _check_distinct(self, runs: list[PlannedRun]) -> None:
        """Refuse two runs with one name, or two runs that are the same experiment."""
        by_name: dict[str, PlannedRun] = {}
        by_experiment: dict[str, PlannedRun] = {}
        for run in runs:
            if run.name in by_name:
                raise ConfigError(f"{self.source}: two runs get the name {run.name} ({_settings(by_name[run.name])} "
                                  f"and {_settings(run)}): a name keeps letters, digits, '.', '+' and '-' and the "
                                  "last 40 characters of each value, so these values cannot be told apart; "
                                  "change one")
            by_name[run.name] = run
            identity = json.dumps(experiment_identity(run.cfg), sort_keys=True, default=str)
            twin = by_experiment.setdefault(identity, run)
            if twin is not run:
                raise ConfigError(f"{self.source}: runs {twin.name} and {run.name} would train the same experiment: "
                                  f"{_same_experiment(twin, run)}. One of them would be trained twice and counted "
                                  "as two seeds of one row; remove it")


def _settings(run: PlannedRun) -> str:
    """A run's own settings (everything but where it goes), as overrides."""
    return ", ".join(o for o in run.overrides if not o.startswith(("out_dir=", "name=")))


def _same_experiment(a: PlannedRun, b: PlannedRun) -> str:
    """Why two planned runs are one experiment: the keys they set differently, and what those are."""
    ta, tb = ({k.strip(): v for k, _, v in (o.partition("=") for o in run.overrides)} for run in (a, b))
    differ = sorted(k for k in set(ta) | set(tb) if ta.get(k) != tb.get(k) and k not in ("out_dir", "name"))
    ignored = [k for k in differ if any(k == m or k.startswith(m + ".") for m in MAY_DIFFER)]
    if differ and ignored == differ:
        return (f"they differ only in {', '.join(differ)}, which do not change what is trained (evaluation "
                "settings belong in the grid's eval: section)")
    shown = "; ".join(f"{k}={ta.get(k)} and {k}={tb.get(k)}" for k in differ if k not in ignored)
    return f"{shown} come to the same config" if shown else "their settings are the same"


def row_of(name: str) -> str:
    """A run's row: its name without the seed part (``alibi_seed-3`` -> ``alibi``)."""
    return "_".join(part for part in name.split("_") if not part.startswith("seed-")) or "run"


def fold_seeds(names: Iterable[str]) -> list[str]:
    """Run names (or paths) with their seeds folded in bash's brace form, in first-seen order:
    ``alibi_seed-2, alibi_seed-3, rope_seed-2`` -> ``alibi_seed-{2,3}, rope_seed-2``; a name
    without a trailing seed stays as it is. A grid's unfinished runs read a line per row."""
    groups: dict[tuple[str, bool], list[str]] = {}
    for name in names:
        found = re.fullmatch(r"(.*seed-)(\d+)", name)
        key = (found.group(1), True) if found else (name, False)
        groups.setdefault(key, []).append(found.group(2) if found else "")
    out = []
    for (stem, seeded), seeds in groups.items():
        if not seeded:
            out += [stem] * len(seeds)
        else:
            unique = sorted(set(seeds), key=int)
            out.append(f"{stem}{unique[0]}" if len(unique) == 1 else f"{stem}{{{','.join(unique)}}}")
    return out


def _text(value: Any) -> str:
    """A value as it would be typed in a key=value override."""
    return value if isinstance(value, str) else json.dumps(value)


def _name_part(value: Any) -> str:
    """A value as part of a directory name: letters, digits and . + - only."""
    text = re.sub(r"[^A-Za-z0-9.+-]+", "_", _text(value)).strip("_")
    return text[-40:] or "x"


def run_stem(name: str, parent: Optional[str] = None) -> str:
    """A run's name without its seed, nor its parent (``init.run``) where a grid axis named
    it: fine-tunes of one experiment's seeds share a stem, as they share a report row."""
    stem = name.replace(f"run-{_name_part(parent)}", "") if parent else name
    stem = re.sub(r"[_-]?seed[-=]?\d+", "", stem)
    return re.sub(r"__+", "_", stem).strip("_") or name


def _suggest(key: str, valid: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(valid), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _axes(tree: dict, path: Path) -> dict:
    """The grid's axes, each a non-empty list of distinct values."""
    axes = tree.get("axes") or {}
    if not isinstance(axes, dict) or not all(isinstance(v, list) and v for v in axes.values()):
        raise ConfigError(f"{path}: 'axes' must map dotted keys to non-empty lists of values")
    for key, values in axes.items():
        texts = [_text(v) for v in values]
        repeated = next((t for i, t in enumerate(texts) if t in texts[:i]), None)
        if repeated is not None:
            raise ConfigError(f"{path}: the axis {key} lists {repeated} twice; each value is one run, so a repeat "
                              "would train one run twice and count it as two seeds; remove it")
    return axes


def _archive(tree: dict, path: Path) -> tuple[Optional[str], bool]:
    """The grid's archive directory (None: none) and whether its records keep weights; an
    archive never inside the report directory, which each report replaces."""
    archive = tree.get("archive")
    if archive is not None and (not isinstance(archive, str) or not archive):
        raise ConfigError(f"{path}: 'archive' must name a directory for the runs' records (e.g. "
                          f"docs/results/{tree['name']}-runs), or be left out")
    archive_weights = tree.get("archive_weights", False)
    if not isinstance(archive_weights, bool):
        raise ConfigError(f"{path}: 'archive_weights' must be true or false (whether the archive's records keep "
                          f"the final weights), not {archive_weights!r}")
    if archive_weights and archive is None:
        raise ConfigError(f"{path}: 'archive_weights: true' keeps weights in the grid's archive, but the grid "
                          f"names none; add archive: DIR (e.g. docs/results/{tree['name']}-runs)")
    report = Path(tree.get("report") or f"reports/{tree['name']}")
    if archive is not None and report in (Path(archive), *Path(archive).parents):
        raise ConfigError(f"{path}: 'archive' ({archive}) lies inside the report directory ({report}), which "
                          "each report replaces; give the archive a directory of its own")
    return archive, archive_weights


def load_grid(path: str | Path) -> Grid:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"grid file not found: {path}; see configs/ablations/ for examples")
    tree, origins = load_config_tree(path)
    valid = {f.name for f in fields(Grid)} - {"source", "eval_overrides"} | {"eval"}
    for key in tree:
        if key not in valid:
            raise ConfigError(f"{origins.get(key, path)}: unknown grid key '{key}'{_suggest(key, valid)}")
    evaluation = tree.get("eval") or {}
    override_section(EvalConfig(), evaluation, str(origins.get("eval", path)), "eval.")  # typed check now
    if not isinstance(tree.get("name"), str) or not tree["name"] or "/" in tree["name"]:
        raise ConfigError(f"{path}: 'name' must be a plain name for the grid's directory")
    if not isinstance(tree.get("base"), str):
        raise ConfigError(f"{path}: 'base' must name the run config the grid starts from")
    axes = _axes(tree, path)
    if not isinstance(tree.get("overrides", []), list):
        raise ConfigError(f"{path}: 'overrides' must be a list of key=value strings")
    variants = tree.get("variants") or {}
    if not isinstance(variants, dict) or not all(
            isinstance(k, str) and re.fullmatch(r"[A-Za-z0-9.+-]+", k) and isinstance(v, list)
            for k, v in variants.items()):
        raise ConfigError(f"{path}: 'variants' must map names (letters, digits, . + -) to lists of "
                          "key=value overrides")
    archive, archive_weights = _archive(tree, path)
    base = Path(origins.get("base", str(path))).parent / tree["base"]
    if not base.is_file():
        raise ConfigError(f"{path}: base config not found: {tree['base']} (looked for {base})")
    return Grid(name=tree["name"], base=base, out_dir=tree.get("out_dir", "runs"),
                overrides=[str(o) for o in tree.get("overrides", [])], axes=axes,
                variants={k: [str(o) for o in v] for k, v in variants.items()},
                eval_overrides=[f"eval.{k}={_text(v)}" for k, v in evaluation.items()],
                report=tree.get("report"), archive=archive, archive_weights=archive_weights, source=path,
                more_seeds=_more_seeds(tree.get("more_seeds"), path), exclude=_exclude(tree.get("exclude"), path),
                slurm=slurm_config(tree["slurm"], str(origins.get("slurm", path))) if "slurm" in tree else None)


def _exclude(value: Any, path: Path) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{path}: 'exclude' must be a list of run-name patterns, e.g. exclude: ['*-gemma3_kind-alibi*']")
    return list(value)


def _more_seeds(value: Any, path: Path) -> dict[str, list[int]]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and v and all(isinstance(s, int) and s >= 0 for s in v)
            for k, v in value.items()):
        raise ConfigError(f"{path}: 'more_seeds' must map row names to lists of seeds (integers >= 0), "
                          "e.g. more_seeds: {alibi: [3, 4]}")
    return {k: list(v) for k, v in value.items()}
