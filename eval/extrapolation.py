"""``python -m eval.extrapolation`` is now ``ropelab eval`` (eval/lm/extrapolation.py); this keeps the old form working for now."""

import sys

from ropelab.common.cli import moved
from ropelab.eval.lm.extrapolation import main

if __name__ == "__main__":
    moved("python -m eval.extrapolation", "ropelab eval")
    sys.exit(main())
