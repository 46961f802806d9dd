"""How every entry point reports what a user did wrong: one ``error: …`` line, exit code 2.

``train.py``, ``ropelab eval`` and every script wrap their ``main`` with
``entry_point``, which also sets up what the command logs for as long as it runs
(common/logs.py); a ``UserError`` (bad config, data, lengths, checkpoints, arguments) or a
refusal of the file system (full disk, no permission, a file where a directory belongs:
common/storage.py) becomes a message without a traceback; anything else stays a bug with
its traceback.

Command-line numbers are checked where argparse reads them (``positive_int``,
``scale_factor``, …), so a bad value is a usage error naming the flag, before any work.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path
from typing import Callable, Optional

from ropelab.common.devices import check_device_name
from ropelab.common.logs import command_logging
from ropelab.common.storage import is_storage_error, storage_error
from ropelab.common.errors import ArgumentError, ConfigError, UserError

USAGE_ERROR = 2  # the exit code of argparse's own usage errors, for the same kind of mistake


def report(error: UserError) -> int:
    print(f"error: {error}", file=sys.stderr, flush=True)
    return USAGE_ERROR


def entry_point(main: Callable[..., int]) -> Callable[..., int]:
    """``main`` returning its exit code, or 2 after printing a UserError's message; its log
    messages set up as common/logs.py says."""
    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            with command_logging():
                return main(*args, **kwargs)
        except UserError as e:
            return report(e)
        except OSError as e:
            if not is_storage_error(e):
                raise
            return report(storage_error(e, "read or write a file"))
        except RuntimeError as e:
            if type(e).__name__ != "OutOfMemoryError":  # torch's, for a GPU (common/ imports no torch)
                raise
            return report(out_of_memory(e))
    return wrapped


def out_of_memory(error: RuntimeError) -> UserError:
    """torch's out-of-memory error of a device, as a message that says what to do."""
    first = (str(error).strip().splitlines() or ["no details"])[0]
    return UserError(f"the device ran out of memory ({first}). What was saved before is kept: checkpoints and "
                     "evaluations are written whole or not at all. Ask for less at once: a smaller train.batch_size "
                     "(raising train.grad_accum keeps the tokens per step), a shorter train.seq_len, or shorter "
                     "evaluated lengths")


def moved(old: str, new: str) -> None:
    """Say on stderr that the entry point ``old`` is now ``new`` (the old one keeps working for now);
    its usage lines then name ``new``. Only when the process was started the old way: a script's
    file by path (``python scripts/X.py``) or an old module (``python -m eval.X``); a grid's jobs
    start the same code as ``python -m ropelab.scripts.X``, which nobody typed and nothing moved."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if old.startswith("python -m "):
        if spec is None or spec.name.removesuffix(".__main__") != old.split()[-1]:
            return
    elif spec is not None:
        return
    sys.argv[0] = new
    print(f"note: `{old}` is now `{new}` (same options); the old form keeps working for now",
          file=sys.stderr, flush=True)


def usage_when_empty(parser: argparse.ArgumentParser, argv: Optional[list[str]]) -> None:
    """Called with no arguments at all: the full help (usage, options, example), exit 2."""
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_help(sys.stderr)
        sys.exit(USAGE_ERROR)


# --------------------------------------------------------------- argparse value types

def _number(text: str, kind: type) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                         f"got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer ≥ 1 (lengths, counts, token budgets)."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value:g}")
    return value


def positive_float(text: str) -> float:
    """A number > 0 (multiples of a length)."""
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value:g}")
    return value


def probability(text: str) -> float:
    """A number in (0, 1] (nucleus sampling's top-p)."""
    value = _number(text, float)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value:g}")
    return value


def scale_factor(text: str) -> float:
    """A RoPE context-extension factor: ≥ 1 (1 is plain RoPE; below 1 would shrink the context)."""
    value = _number(text, float)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (the context is extended s-fold; 1 = plain RoPE), "
                                         f"got {value:g}")
    return value


def device_name(text: str) -> str:
    """auto, cpu, cuda, cuda:N or mps (common/devices.py); availability is checked when used."""
    try:
        return check_device_name(text, "--device")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--device: ")) from None


# --------------------------------------------------------------- output paths, checked before any work

def _file_in_the_way(path: Path) -> Optional[Path]:
    return next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)


def check_output_dir(path: Path, flag: str) -> None:
    """Refuse ``path`` as a directory to write into when it, or a parent, is a file."""
    blocking = _file_in_the_way(Path(path))
    if blocking is not None:
        raise ArgumentError(f"{flag} {path}: {blocking} is a file, but a directory is needed there; "
                            "choose another path or move the file away (nothing was done)")


def check_output_file(path: Path, flag: str) -> None:
    """Refuse ``path`` as a file to write when it is a directory or a parent is a file."""
    path = Path(path)
    if path.is_dir():
        raise ArgumentError(f"{flag} {path} is a directory; give the path of a file to write, "
                            f"e.g. {path / 'out.json'} (nothing was done)")
    check_output_dir(path.parent, flag)
