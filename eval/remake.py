"""``python -m eval.remake`` is now ``ropelab regenerate`` (eval/regenerate.py); this keeps the old form working for now."""

import sys

from ropelab.common.cli import moved
from ropelab.eval.regenerate import main

if __name__ == "__main__":
    moved("python -m eval.remake", "ropelab regenerate")
    sys.exit(main())
