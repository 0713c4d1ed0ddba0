"""Logging a collector's trouble once per state change, not every tick (every collector uses it)."""
from __future__ import annotations

import logging


class LogOnce:
    """Log a collector's trouble once per state change, not every tick.

    ``problem(msg)`` logs at WARNING when the message (its first ``key_len`` characters) differs
    from the last one; ``ok()`` logs one INFO line when the source recovers.
    """

    def __init__(self, logger: logging.Logger, what: str, key_len: int = 80) -> None:
        self.log = logger
        self.what = what
        self.key_len = key_len
        self._last: str | None = None
        self.count = 0  # problems logged (tests read it)

    def problem(self, msg: str, level: int = logging.WARNING) -> None:
        key = msg[: self.key_len]
        if key != self._last:
            self._last = key
            self.count += 1
            self.log.log(level, "%s: %s", self.what, msg)

    def ok(self) -> None:
        if self._last is not None:
            self._last = None
            self.log.info("%s: recovered", self.what)

    @property
    def in_trouble(self) -> bool:
        return self._last is not None
