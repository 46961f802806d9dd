"""Errors a user can cause (bad config, data, lengths, checkpoints).

Every CLI catches ``UserError`` and prints its message without a traceback, exiting
non-zero; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Something the user can fix; the message says what was wrong and what to do."""


class ConfigError(UserError, ValueError):
    """A configuration key, type or value is invalid."""


class LengthError(UserError, ValueError):
    """A sequence is longer than a positional encoding or a KV cache can serve."""


class DataError(UserError):
    """Missing, empty or unreadable data."""


class CheckpointError(UserError):
    """A checkpoint is missing, truncated, foreign or incompatible."""
