"""Typed, validating reads of ``config.json`` fields.

Every failure is a :class:`usg.errors.InputError` (the file's content is bad: exit code 1) that names the file, the
field (with its JSON path), the value found and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from usg.errors import InputError

__all__ = ["Fields"]

_MISSING = object()


class Fields:
    """A view over one (sub-)object of a config file that validates as it reads."""

    def __init__(
        self,
        data: Mapping[str, Any],
        *,
        source: str,
        prefix: str = "",
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.data = data
        self.source = source
        self.prefix = prefix
        self.defaults = dict(defaults or {})
        self.defaulted: list[str] = []

    def path(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def sub(self, key: str, defaults: Mapping[str, Any] | None = None) -> Fields:
        value = self.data.get(key)
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise self.error(key, value, "must be a JSON object")
        return Fields(value, source=self.source, prefix=f"{self.prefix}{key}.", defaults=defaults)

    def error(self, key: str, value: object, what: str, fix: str | None = None) -> InputError:
        fix = fix or f"set {self.path(key)!r} in {self.source} to the value of the published config.json"
        return InputError(f"{self.source}: field {self.path(key)!r} {what} (got {value!r}); fix: {fix}")

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        value = self.data.get(key)
        if value is not None:
            return value
        if key in self.defaults:
            self.defaulted.append(f"{self.path(key)}={self.defaults[key]!r}")
            return self.defaults[key]
        if default is not _MISSING:
            return default
        raise InputError(
            f"{self.source}: required field {self.path(key)!r} is missing; "
            f"fix: copy {self.path(key)!r} from the model's published config.json"
        )

    def integer(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        value = self.raw(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)  # NaN / Infinity: json accepts them
            or int(value) != value
        ):
            raise self.error(key, value, "must be an integer")
        if value < minimum:
            raise self.error(key, value, f"must be >= {minimum}")
        return int(value)

    def opt_int(self, key: str, *, minimum: int = 1) -> int | None:
        if self.data.get(key) is None and key not in self.defaults:
            return None
        value = self.raw(key, None)
        return None if value is None else self.integer(key, minimum=minimum)

    def number(self, key: str, default: Any = _MISSING) -> float:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise self.error(key, value, "must be a finite, positive number")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, value, "must be true or false")
        return value

    def string(self, key: str, default: Any = _MISSING) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise self.error(key, value, "must be a string")
        return value
