"""Bad input in configs, swept over the schema: every numeric key refuses a negative value and
every choice an unknown one, naming the key, before any work; a key written twice in a
file and contradictory ``init`` settings are refused too.

These go through ``load_config`` (what train.py, grids and every run directory's config
use); one case per class runs train.py itself.
"""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from helpers.bad_input import cli, refused
from ropelab.common.errors import ConfigError
from ropelab.configs import load_config
from ropelab.configs.loader import all_keys
from ropelab.configs.schema import RunConfig

QUICK = "configs/quickstart.yaml"


def _leaf_type(key: str):
    """The type of a dotted key of RunConfig, Optional unwrapped."""
    cls = RunConfig
    for part in key.split("."):
        cls = typing.get_type_hints(cls)[part]
        if typing.get_origin(cls) is typing.Union:
            cls = next(a for a in typing.get_args(cls) if a is not type(None))
    return cls


KEYS = all_keys(RunConfig)
NUMERIC = [k for k in KEYS if _leaf_type(k) in (int, float)]
CHOICES = [k for k in KEYS if typing.get_origin(_leaf_type(k)) is typing.Literal]


@pytest.mark.parametrize("key", NUMERIC)
def test_every_numeric_key_refuses_a_negative_value(key):
    """No count, size, rate, seed or factor of the schema means anything below 0 (numpy's
    generators refuse negative seeds, a negative norm_eps makes RMSNorm NaN): each is
    refused when the config loads, naming the key."""
    with pytest.raises(ConfigError) as e:
        load_config(QUICK, [f"{key}=-1", "model.pos.kind=learned" if key == "model.pos.max_len" else "name=x"])
    assert key.split(".")[-1] in str(e.value), str(e.value)


@pytest.mark.parametrize("key", CHOICES)
def test_every_choice_refuses_an_unknown_value(key):
    choices = typing.get_args(_leaf_type(key))
    with pytest.raises(ConfigError) as e:
        load_config(QUICK, [f"{key}={choices[0]}x"])
    message = str(e.value)
    assert key in message and f"did you mean '{choices[0]}'" in message, message


def test_a_negative_seed_on_the_command_line():
    refused(cli("train.py", QUICK, "train.seed=-1", "out_dir=/nonexistent/never"), "train.seed must be 0 or more")


@pytest.mark.parametrize("text, fragment, kept", [
    ("train:\n  lr: 1.0e-3\n  lr: 2.0e-3\n", "the key 'lr' is written twice in one mapping (lines 3 and 4)",
     "train:\n  lr: 2.0e-3\n"),
    ("model: {d_model: 64}\nmodel: {n_layers: 2}\n", "the key 'model' is written twice", "model: {n_layers: 2}\n"),
], ids=["a-setting", "a-section"])
def test_a_key_written_twice_in_a_config_file(tmp_path, text, fragment, kept):
    path = tmp_path / "twice.yaml"
    path.write_text(f"inherit: {Path(QUICK).resolve()}\n{text}")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and fragment in str(e.value) and "keep one" in str(e.value)
    path.write_text(f"inherit: {Path(QUICK).resolve()}\n{kept}")  # the advice
    assert load_config(path)


@pytest.mark.parametrize("overrides, fragment, advised", [
    (["init.run=runs/x", "init.step=-2"], "init.step is a training step of the parent, 0 or more", None),
    (["init.run=runs/x", "init.step=4", "init.which=best"], "give one of them", ["init.run=runs/x", "init.step=4"]),
    (["init.step=4"], "set init.run", ["init.step=4", "init.run=runs/x"]),
    (["init.which=best"], "set init.run", ["init.which=best", "init.run=runs/x"]),
], ids=["negative-step", "step-and-best", "step-without-run", "which-without-run"])
def test_init_settings_that_contradict_each_other(overrides, fragment, advised):
    with pytest.raises(ConfigError) as e:
        load_config(QUICK, overrides)
    assert fragment in str(e.value)
    if advised is not None:
        assert load_config(QUICK, advised).init.run == "runs/x"


# --------------------------------------------------------------- config files named wrongly or alone

def test_a_misspelt_config_file_gets_the_closest_name():
    """Misspelt keys got "did you mean"; a misspelt file name only "config file not found"."""
    refused(cli("train.py", "configs/quickstrat.yaml"),
            "config file not found: configs/quickstrat.yaml (did you mean configs/quickstart.yaml?)")
    refused(cli("train.py", "configs/pe/alibii.yaml"), "(did you mean configs/pe/alibi.yaml?)")


def test_an_overlay_alone_is_refused_not_trained_on_the_schema_defaults(tmp_path):
    """python train.py configs/pe/alibi.yaml trained a run named "run" on a 256-token vocabulary."""
    res = cli("train.py", "configs/pe/alibi.yaml", f"out_dir={tmp_path / 'runs'}")
    refused(res, "configs/pe/alibi.yaml sets only model settings and inherits no preset: it is an overlay",
            "python train.py configs/quickstart.yaml model.pos.kind=alibi",
            "inherit: [quickstart.yaml, pe/alibi.yaml]")
    assert res.stderr.count("\n") == 1 and not (tmp_path / "runs").exists()
    refused(cli("train.py", "configs/pe/gemma3.yaml"), "inherit: [quickstart.yaml, pe/gemma3.yaml]")
    # The advice, followed: a config that inherits a preset and the overlay is a run's config.
    from helpers import ROOT
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"inherit: [{ROOT / 'configs' / 'quickstart.yaml'}, {ROOT / 'configs' / 'pe' / 'alibi.yaml'}]\n")
    cfg = load_config(mine)
    assert cfg.name == "quickstart" and cfg.model.pos.kind == "alibi"
