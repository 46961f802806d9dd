"""When two run configs are the same experiment: the one definition, used everywhere.

``train.py --resume`` refuses a config that is not the run's own experiment,
``ropelab ablate`` reports a run on disk whose experiment differs from the grid's as a
conflict, and evaluation pools runs that are the same experiment apart from the seed (and
trained for the same number of tokens) as seeds of one row. All three use
``experiment_differences`` with the one list below.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterable

from ropelab.configs.loader import config_to_dict
from ropelab.configs.schema import RunConfig
from ropelab.model.encodings import DEFAULT_DAPE_BASE

# Keys that may differ between two configs of one experiment: they name or place the
# run, schedule its checkpoints and logs, choose where it runs, or say how long to train
# (a run may be extended: a grid that raises max_steps continues its finished runs).
MAY_DIFFER: tuple[str, ...] = (
    "name", "out_dir", "eval", "log",
    "model.vocab_size",  # derived from data.tokenizer, which is compared
    "data.cache_dir", "data.num_proc", "data.hub.streaming",  # where and how tokens are made, not which
    "train.max_steps", "train.max_tokens",
    "train.eval_interval", "train.eval_batches", "train.ckpt_interval", "train.keep_last",
    "train.log_interval", "train.resume", "train.compile", "train.device",
)
SEED = "train.seed"
DATA_SEED = "train.data_seed"  # the batches' order: a replicate's seed like train.seed
# An evaluation key that steers training: with train.stop_at_accuracy the competence stop
# scores multikey/vartrack with the questions the evaluation asks (training/competence.py),
# so two runs that differ in it may stop at different steps. It counts where a competence
# stop reads it and it differs from data.synthetic.asked (unset or equal, the stop scores
# the tasks as trained, and the identity is what it was before the key steered anything).
# eval.tasks.depths steers the stop too, less: it places the needles of the stop's fixed
# instances (data/tasks/batches.py: length_set), which train.eval_batches sizes; like that
# key it does not count: the instances and their questions are the same kind either way.
STEERS_STOP = "eval.tasks.asked"
# Keys the schema gained after runs were recorded, each with the value that leaves a run what
# it was. At that value a key is left out of the identity, so every earlier run, config and
# record stays the same experiment (and ``seed_group`` the same hash); set to anything else,
# it counts like any other key.
ADDED_LATER: dict[str, object] = {
    "model.layers.pattern": "",  # a layer plan (model/layer_config.py); "" is a uniform model
    "model.pos.dape.base": DEFAULT_DAPE_BASE,  # DAPE's settings, read only by pos.kind=dape
    "model.pos.dape.mlp_width": 32,
    "train.data_seed": None,  # the data order's own seed; null follows train.seed
}


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _counts(key: str, ignored: tuple[str, ...]) -> bool:
    return not any(key == k or key.startswith(k + ".") for k in ignored)


def experiment_identity(cfg: RunConfig, ignore: Iterable[str] = ()) -> dict[str, object]:
    """Dotted key -> value for every key that defines the experiment (and is not ignored)."""
    ignored = MAY_DIFFER + tuple(ignore)
    flat = _flatten(config_to_dict(cfg))
    identity = {k: v for k, v in flat.items()
                if _counts(k, ignored) and not (k in ADDED_LATER and v == ADDED_LATER[k])}
    asked = flat.get(STEERS_STOP)
    if cfg.train.stop_at_accuracy is not None and asked is not None and asked != cfg.data.synthetic.asked \
            and _counts(STEERS_STOP, tuple(ignore)):
        identity[STEERS_STOP] = asked
    return identity


def experiment_differences(a: RunConfig, b: RunConfig, ignore: Iterable[str] = ()) -> list[str]:
    """The dotted keys whose values make ``a`` and ``b`` different experiments (sorted)."""
    ia, ib = experiment_identity(a, ignore), experiment_identity(b, ignore)
    return sorted(k for k in set(ia) | set(ib) if ia.get(k) != ib.get(k))


def seed_group(cfg: RunConfig) -> str:
    """A short hash shared by configs that are the same experiment apart from the seeds
    (initialisation, data order)."""
    identity = json.dumps(experiment_identity(cfg, ignore=(SEED, DATA_SEED)), sort_keys=True, default=str)
    return hashlib.sha256(identity.encode()).hexdigest()[:12]
