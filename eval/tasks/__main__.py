"""``python -m eval.tasks`` is now ``ropelab tasks`` (eval/tasks/exact_match.py); this keeps the old form working for now."""

import sys

from ropelab.common.cli import moved
from ropelab.eval.tasks.exact_match import main

if __name__ == "__main__":
    moved("python -m eval.tasks", "ropelab tasks")
    sys.exit(main())
