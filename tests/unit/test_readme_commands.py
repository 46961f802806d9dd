"""Every command the README shows is one a newcomer can type as it stands: a `ropelab` command
names a subcommand and its arguments parse, and a `python train.py` line's config and
overrides load. CI runs them all, shortened (.ci/readme_commands.py); the tests of each command
(integration/test_bench.py, test_finetune.py, test_ablate.py, test_eval.py and others) run them
in small."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex

import pytest

from helpers import ROOT
from ropelab.configs import load_config
from ropelab.scripts.cli import COMMANDS

README = (ROOT / "README.md").read_text(encoding="utf-8")
# Inline code spans and lines of fenced bash blocks that start with one of the two entry points.
SPANS = re.findall(r"`((?:ropelab|python train\.py) [^`]+)`", README)
FENCED = [line.split("  #")[0].strip() for block in re.findall(r"```bash\n(.*?)```", README, re.S)
          for line in block.splitlines() if line.startswith(("ropelab ", "python train.py "))]
COMMAND_LINES = sorted(c for c in set(SPANS + FENCED) if "--help" not in c)  # --help prints and exits
PARSERS = {"sample": "ropelab.scripts.sample", "diagnose": "ropelab.scripts.diagnose",
           "ablate": "ropelab.scripts.ablate", "export": "ropelab.scripts.export_hf", "bench": "ropelab.scripts.bench"}


def test_the_readme_shows_the_commands_a_newcomer_runs():
    assert any(c.startswith("python train.py configs/quickstart.yaml init.run=") and "train.max_steps=" in c
               for c in COMMAND_LINES)  # the fine-tune example has a step limit
    assert {c.split()[1] for c in COMMAND_LINES if c.startswith("ropelab ")} >= {"sample", "eval", "ablate", "bench"}


@pytest.mark.parametrize("line", COMMAND_LINES)
def test_each_readme_command_parses(line: str):
    words = shlex.split(line)
    if words[0] == "python":
        config, overrides = words[2], [w for w in words[3:] if "=" in w]
        load_config(ROOT / config, overrides)
        return
    name, args = words[1], words[2:]
    assert name in COMMANDS, f"README names `ropelab {name}`, which is no subcommand"
    if name in PARSERS:
        module = importlib.import_module(PARSERS[name])
        if "*" not in line:  # a shell glob is the shell's to expand
            module.parse_args(args)


def test_ci_runs_every_readme_command_in_order_and_shortened():
    """.ci/readme_commands.py finds each command above, the quickstart first; shortened, a training
    stops at 20 steps (after the README's own step limit), and a grid's training is its dry run."""
    spec = importlib.util.spec_from_file_location("readme_commands", ROOT / ".ci" / "readme_commands.py")
    ci = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ci)
    found = ci.readme_commands(README)
    assert found[0] == "python train.py configs/quickstart.yaml"
    assert set(COMMAND_LINES) - {c for c in COMMAND_LINES if "PATH" in c} <= set(found)
    finetune = next(c for c in found if "init.run=" in c)
    assert ci.shortened(finetune)[-3:] == ["train.max_steps=20", "train.eval_interval=10", "log.progress=false"]
    study = next(c for c in found if c.startswith("ropelab ablate") and "--jobs" in c)
    assert ci.shortened(study)[-2:] == ["--dry-run", "--no-estimate"] and ci.trains_a_grid(shlex.split(study))
    assert not any(c.startswith(("pip ", "python -m pytest", "python3 -m venv")) for c in found)
