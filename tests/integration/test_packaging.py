"""One importable package and one command: ``ropelab`` is the only name installing adds,
``ropelab COMMAND`` reaches every tool, and the old entry points still work, saying what
replaced them."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib

import pytest

from ropelab.scripts import cli

from helpers import ROOT


def test_installing_adds_one_top_level_name():
    dist = importlib.metadata.distribution("ropelab")
    assert (dist.read_text("top_level.txt") or "").split() == ["ropelab"]
    [script] = [e for e in dist.entry_points if e.group == "console_scripts"]
    assert (script.name, script.value) == ("ropelab", "ropelab.scripts.cli:main")


def test_every_folder_of_the_project_is_a_declared_sub_package():
    """pyproject.toml lists the packages by hand (the root maps to ``ropelab``): a new
    folder with an __init__.py must be listed, or a non-editable install leaves it out."""
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"ropelab"} | {"ropelab." + ".".join(p.parent.relative_to(ROOT).parts)
                           for top in ("common", "model", "configs", "data", "training", "eval", "grid", "bench",
                                       "scripts") for p in (ROOT / top).rglob("__init__.py")}
    assert declared == found


def test_the_network_is_one_import_away():
    from ropelab.model import ModelConfig, Transformer
    assert Transformer(ModelConfig(d_model=32, n_layers=1, n_heads=2)).num_params() > 0


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_every_command_answers_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([name, "--help"])
    assert e.value.code == 0
    assert f"usage: ropelab {name}" in " ".join(capsys.readouterr().out.split())


def test_the_front_door_lists_commands_and_suggests_the_closest(capsys):
    assert cli.main([]) == 2 and "commands:" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in cli.COMMANDS)
    assert cli.main(["evl", "runs/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ropelab has no command 'evl'; did you mean 'eval'?") and "Traceback" not in err


@pytest.mark.parametrize("old, new", [(["-m", "eval.tasks"], "ropelab tasks"),
                                      (["-m", "eval.extrapolation"], "ropelab eval"),
                                      (["scripts/sample.py"], "ropelab sample")])
def test_old_entry_points_work_and_say_what_replaced_them(old, new):
    res = subprocess.run([sys.executable, *old, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"is now `{new}`" in res.stderr and f"usage: {new}" in " ".join(res.stdout.split())


def test_the_module_a_grid_job_starts_says_nothing_moved():
    """A grid's diagnostics job runs ``python -m ropelab.scripts.diagnose``: its log gets no note
    about ``python scripts/diagnose.py``, which nobody typed."""
    res = subprocess.run([sys.executable, "-m", "ropelab.scripts.diagnose", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "is now" not in res.stderr and res.stdout.startswith("usage:")
