"""Value checks shared by the config sections (configs/schema.py and the modules it gathers)."""

from __future__ import annotations

from common.errors import ConfigError


def positive(section: str, obj: object, *names: str, allow_none: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None and allow_none:
            continue
        if value is None or value < 1:
            raise ConfigError(f"{section}.{name} must be a positive integer (got {value!r})")
