"""How every entry point reports what a user did wrong: one ``error: …`` line, exit code 2.

``train.py``, ``python -m eval.extrapolation`` and every script wrap their ``main`` with
``entry_point``; a ``UserError`` (bad config, data, lengths, checkpoints, arguments)
becomes a message without a traceback, anything else stays a bug with its traceback.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

from model.errors import UserError

USAGE_ERROR = 2  # the exit code of argparse's own usage errors, for the same kind of mistake


def report(error: UserError) -> int:
    print(f"error: {error}", file=sys.stderr, flush=True)
    return USAGE_ERROR


def entry_point(main: Callable[..., int]) -> Callable[..., int]:
    """``main`` returning its exit code, or 2 after printing a UserError's message."""
    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except UserError as e:
            return report(e)
    return wrapped
