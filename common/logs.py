"""What commands say about their work, through the standard ``logging`` module.

Every module logs to ``get_logger(__name__)``, a logger under ``ropelab`` (``ropelab.grid.local``,
...). A command sets the output up for as long as it runs: common/cli.py's ``entry_point``
calls ``setup_logging`` before ``main`` and puts back what was there after it, so a notebook or
a test that calls a command twice starts from the same state; a library call outside any
command shows only warnings (Python's own last-resort handler), as libraries should.

- Messages read as a ``print`` of them did (``%(message)s``; a warning carries its own
  ``warning:`` or ``note:``): progress and status (INFO, DEBUG) on stdout, warnings and
  errors on stderr. A command whose stdout is its product (a benchmark's table, a worker's
  JSON) sends everything to stderr (``setup_logging(info_to="stderr")``).
- Each line is written through ``tqdm.write`` to the stream as it is at that moment (a
  redirect, pytest's capture), so a progress bar on the terminal is drawn again below it
  instead of being broken.
- ``ROPELAB_LOG_LEVEL``: DEBUG, INFO (the default), WARNING or ERROR. ``ROPELAB_LOG_FILE``:
  also append every message at that level to this file, with its time, level and module.
- Under torchrun every rank runs the command; only rank 0 shows INFO, the others WARNING and
  above (the rank is ``RANK``, which torchrun sets; training/runtime.py checks its value).

What a command prints as its result (a table, generated text, ``--print-config``, a worker's
JSON) and its ``error:`` line (common/cli.py) are not log messages: they stay ``print``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Iterator, Optional

from tqdm import tqdm

from ropelab.common.errors import ConfigError

ROOT_LOGGER = "ropelab"
LEVEL_VARIABLE, FILE_VARIABLE = "ROPELAB_LOG_LEVEL", "ROPELAB_LOG_FILE"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (its ``__name__``): under ``ropelab`` whatever way the
    module was started (``python train.py`` names train.py's module after the main script)."""
    return logging.getLogger(name if name.split(".")[0] == ROOT_LOGGER else f"{ROOT_LOGGER}.{name}")


class _Console(logging.Handler):
    """One line per record on ``sys.stdout`` or ``sys.stderr`` as it is when the record comes
    (not as it was at set-up), through ``tqdm.write``; ``below``: only records under that level."""

    def __init__(self, stream: str, level: int, below: Optional[int] = None):
        super().__init__(level)
        self.stream, self.below = stream, below

    def emit(self, record: logging.LogRecord) -> None:
        if self.below is not None and record.levelno >= self.below:
            return
        try:
            stream = getattr(sys, self.stream)
            tqdm.write(self.format(record), file=stream)
            stream.flush()
        except Exception:  # as logging.StreamHandler: a broken stream must not stop the command
            self.handleError(record)


def level_from_env() -> int:
    text = os.environ.get(LEVEL_VARIABLE, "INFO").strip().upper()
    if text not in LEVELS:
        raise ConfigError(f"{LEVEL_VARIABLE}={text!r}: expected one of {', '.join(LEVELS)}")
    return getattr(logging, text)


def _rank() -> int:
    text = os.environ.get("RANK", "0").strip()
    return int(text) if text.isdigit() else 0  # a wrong value is training/runtime.py's error to report


def setup_logging(level: Optional[int] = None, file: Optional[str] = None, info_to: str = "stdout") -> None:
    """Send the ``ropelab`` loggers' messages at ``level`` and above (default: ``ROPELAB_LOG_LEVEL``,
    else INFO) to the console, INFO and DEBUG to ``info_to`` ("stdout" or "stderr") and warnings
    to stderr, and to ``file`` too (default: ``ROPELAB_LOG_FILE``); replaces an earlier set-up."""
    if level is None:
        level = level_from_env()
    if file is None:
        file = os.environ.get(FILE_VARIABLE) or None
    logger = logging.getLogger(ROOT_LOGGER)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    console = level if _rank() == 0 else max(level, logging.WARNING)
    if info_to == "stderr":
        handlers: list[logging.Handler] = [_Console("stderr", console)]
    else:
        handlers = [_Console("stdout", console, below=logging.WARNING),
                    _Console("stderr", max(console, logging.WARNING))]
    if file:
        handlers.append(logging.FileHandler(file, encoding="utf-8"))
        handlers[-1].setLevel(level)
        handlers[-1].setFormatter(logging.Formatter(FILE_FORMAT))
    for handler in handlers:
        logger.addHandler(handler)
    logger.setLevel(level)


@contextlib.contextmanager
def command_logging() -> Iterator[None]:
    """``setup_logging`` for the duration of one command; what was there before is put back after."""
    logger = logging.getLogger(ROOT_LOGGER)
    before = (list(logger.handlers), logger.level)
    logger.handlers = []  # kept open: they are put back
    setup_logging()
    try:
        yield
    finally:
        for handler in logger.handlers:
            handler.close()
        logger.handlers, logger.level = before[0], before[1]
