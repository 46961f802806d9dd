"""ropelab: a small LLaMA-style decoder for studying positional encodings.

The repository's folders are this package's sub-packages (pyproject.toml maps them), so a
notebook imports ``from ropelab.model import Transformer`` and the ``ropelab`` command
(scripts/cli.py) is the front door to every tool.
"""

__version__ = "0.1.0"
