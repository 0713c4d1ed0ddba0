"""Shared CLI plumbing: one-line errors with exit code 2, never a traceback.

Exit codes (docs/cli.md#exit-codes): 0 no finding at or above --fail-on, 1 findings, 2 bad usage or
unreadable input (one line on stderr), 3 an internal error escaped (a bug: one line on stderr, the
traceback only with ``--debug`` or ``FRAGSCOPE_DEBUG=1``), 4 no finding at or above --fail-on but the
verdict is incomplete: a source it needed was down (``signals.sources_down``), never a silent 0.
"""
from __future__ import annotations

import os

import sys

import click

from .base import (EXIT_CRASH, EXIT_FINDINGS, EXIT_OK, EXIT_SOURCES_DOWN, EXIT_USAGE,  # noqa: F401 (re-exported)
                   CommandError, prog_name, exit_now, exit_without_teardown, install_progress)


class UsageError(click.ClickException, CommandError):
    """Bad usage or unreadable input: printed as one line on stderr, exit code 2."""

    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:  # one line, no "Error:" box
        click.echo(f"{prog_name()}: error: {self.format_message()}", err=True)


from ..units import json_safe  # noqa: E402,F401  (re-exported: the CLI writes JSON through it)


class Duration(click.ParamType):
    """A duration option (``30s``, ``5m``, ``1h30m``, ``250ms``; a bare number is seconds) -> seconds,
    through the one duration parser (:func:`fragscope.units.parse_duration`), within [lo, hi]."""

    name = "DURATION"

    def __init__(self, lo: float | None = None, hi: float | None = None) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        from ..units import fmt_seconds, parse_duration

        try:
            v = parse_duration(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            lo = fmt_seconds(self.lo) if self.lo is not None else "0"
            hi = fmt_seconds(self.hi) if self.hi is not None else "any"
            self.fail(f"{value!r} is out of range ({lo} to {hi})", param, ctx)
        return v


class ByteSize(click.ParamType):
    """A size option in bytes (``512MiB``, ``2GiB``; a bare number is bytes; ``GB`` is GiB, as GPU tools
    say it) -> int bytes, through the one size parser (:func:`fragscope.units.parse_size`)."""

    name = "SIZE"

    def __init__(self, hi: int | None = None, lo: int | None = None) -> None:
        self.hi, self.lo = hi, lo

    def convert(self, value, param, ctx):
        from ..units import fmt_bytes, parse_size

        try:
            v = parse_size(value, decimal_si=False)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if self.hi is not None and v > self.hi:
            self.fail(f"{value!r} is over {fmt_bytes(self.hi)}", param, ctx)
        if self.lo is not None and v < self.lo:
            self.fail(f"{value!r} is under {fmt_bytes(self.lo)}", param, ctx)
        return v


class GibSize(click.ParamType):
    """A memory option: a bare number is GiB (``80``); a unit is honoured (``80GiB``, ``81920MiB``;
    'GB' is GiB) through the one size parser. -> bytes (float), or GiB when ``as_gib``."""

    name = "SIZE"

    def __init__(self, as_gib: bool = False, allow_zero: bool = True) -> None:
        self.as_gib, self.allow_zero = as_gib, allow_zero

    def convert(self, value, param, ctx):
        import math

        from ..units import GiB, parse_size

        if isinstance(value, (int, float)) and not isinstance(value, bool):
            v = float(value) * GiB
        else:
            text = str(value).strip()
            try:
                v = float(text) * GiB
            except ValueError:
                try:
                    v = float(parse_size(text, decimal_si=False, allow_zero=True))
                except ValueError:
                    self.fail(f"{value!r} is not a size (write e.g. 80, 80GiB or 81920MiB)", param, ctx)
        if not math.isfinite(v) or v < 0 or (v == 0 and not self.allow_zero):
            self.fail(f"{value!r} must be a finite size {'≥' if self.allow_zero else '>'} 0", param, ctx)
        return v / GiB if self.as_gib else v


def fail(msg: str) -> "None":
    raise UsageError(msg.splitlines()[0] if msg else "error")


def dumps_json(obj, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj`` (no NaN/Infinity tokens, ever): see :func:`json_safe`."""
    import json

    return json.dumps(json_safe(obj), indent=indent, allow_nan=False)
