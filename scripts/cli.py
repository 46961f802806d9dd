"""The ``ropelab`` command: one front door to every tool, ``ropelab COMMAND [options]``.

Each subcommand is an existing command line with the same flags (``ropelab eval`` is what
``ropelab eval`` was); ``ropelab COMMAND --help`` prints its own help. The
commands are imported only when asked for, so ``ropelab --help`` answers at once.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import Optional

from ropelab.common.cli import USAGE_ERROR, entry_point

# name -> (module whose ``main(argv)`` runs it, what it does). Order: the README's order.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("ropelab.train", "train a model from a YAML config (same as python train.py)"),
    "sample": ("ropelab.scripts.sample", "generate text from a trained run"),
    "eval": ("ropelab.eval.lm.extrapolation", "perplexity as the length grows past training, with intervals"),
    "tasks": ("ropelab.eval.tasks.exact_match", "exact-match accuracy on synthetic tasks by length"),
    "diagnose": ("ropelab.scripts.diagnose", "what attention does as the length grows"),
    "ablate": ("ropelab.scripts.ablate", "train, evaluate and report a grid of runs"),
    "tune": ("ropelab.scripts.tune", "choose each encoding's setting from a finished sweep grid"),
    "regimes": ("ropelab.eval.lm.regime_compare", "compare training regimes by whether position can matter"),
    "regenerate": ("ropelab.eval.regenerate", "make a report again from its results.json"),
    "position-bias": ("ropelab.scripts.position_bias", "what a trained run's score bias does with distance"),
    "device-session": ("ropelab.scripts.device_session", "train and evaluate what fits in a lent machine's time, "
                                                         "records in one folder"),
    "export": ("ropelab.scripts.export_hf", "export a RoPE run to Hugging Face transformers, or import one"),
    "bench": ("ropelab.scripts.bench", "speed and memory against the machine's own limit"),
    "bench-eval": ("ropelab.scripts.bench_eval", "evaluation time A/B against an older tree"),
    "bench-nanogpt": ("ropelab.scripts.bench_nanogpt", "our training against nanoGPT's, A/B"),
    "plot-rope": ("ropelab.scripts.plot_rope", "pictures that explain RoPE"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return ("usage: ropelab COMMAND [options]   (ropelab COMMAND --help for its options)\n\ncommands:\n"
            + "\n".join(lines) + "\n\nexample: ropelab train configs/quickstart.yaml\n")


@entry_point
def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage(), end="", file=sys.stdout if args else sys.stderr)
        return 0 if args else USAGE_ERROR
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        hint = next(iter(difflib.get_close_matches(name, COMMANDS, n=1)), None)
        print(f"error: ropelab has no command {name!r}{f'; did you mean {hint!r}?' if hint else ''} "
              f"Commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return USAGE_ERROR
    module = importlib.import_module(COMMANDS[name][0])
    sys.argv[0] = f"ropelab {name}"  # argparse's usage lines name the command as typed
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
