"""Errors a user can cause (bad config, data, lengths, checkpoints, arguments).

Every entry point reports ``UserError`` as one ``error: …`` line without a traceback and
exits 2 (``common.cli.entry_point``); anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Something the user can fix; the message says what was wrong and what to do."""


class ConfigError(UserError, ValueError):
    """A configuration key, type or value is invalid."""


class ArgumentError(UserError, ValueError):
    """A function or command-line argument is out of range (e.g. a sampling temperature)."""


class LengthError(UserError, ValueError):
    """A sequence is longer than a positional encoding or a KV cache can serve."""


class DataError(UserError):
    """Missing, empty or unreadable data."""


class CheckpointError(UserError):
    """A checkpoint is missing, truncated, foreign or incompatible."""


class StorageError(UserError):
    """The file system refused: a path of the wrong kind, a full disk, no permission."""


class RunInUseError(UserError):
    """Another process is training into the same run directory."""


class NonFiniteOutput(UserError):
    """A model whose weights are finite computed NaN or infinite values (its forward
    overflowed): nothing computed from them means anything, so nothing is scored or sampled."""

    def __init__(self, found: str):  # e.g. "the loss at length 64 is nan"
        super().__init__(f"{found}, although the model's weights are finite: its forward overflows "
                         "there (weights this extreme come from a training that went wrong), so nothing computed "
                         "from it would mean anything, and nothing was scored or written")


def positive(section: str, obj: object, *names: str, allow_none: bool = False) -> None:
    """Raise a ConfigError naming ``section.name`` for each of ``names`` on ``obj`` that is not a
    positive integer (None passes with ``allow_none``): the config sections' shared check."""
    for name in names:
        value = getattr(obj, name)
        if value is None and allow_none:
            continue
        if value is None or value < 1:
            raise ConfigError(f"{section}.{name} must be a positive integer (got {value!r})")
