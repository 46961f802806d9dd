"""Code the test files share (pytest's ``pythonpath`` puts tests/ on the path, so a test
imports ``from helpers.models import tiny_config``); fixtures live in tests/conftest.py.

- ``models``: tiny model configs for every positional encoding, sharpened random models.
- ``runs``: tiny run configs and the grid files over them, copies of trained runs, a
  training stopped as if by SIGTERM.
- ``tasks``: the synthetic tasks' tokenizer and instances, task report rows, a stand-in model.
- ``reference``: slow, obvious references the model is compared against.
- ``hf``: what the transformers export and import tests share.
- ``bad_input``: running a command and checking that it was refused cleanly.
- ``fake_slurm``: stand-ins for Slurm's commands.

Test files never import each other: what two of them need lives here.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
