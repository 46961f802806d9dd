"""``python -m eval.regimes`` is now ``ropelab regimes`` (eval/lm/regime_compare.py); this keeps the old form working for now."""

import sys

from ropelab.common.cli import moved
from ropelab.eval.lm.regime_compare import main

if __name__ == "__main__":
    moved("python -m eval.regimes", "ropelab regimes")
    sys.exit(main())
