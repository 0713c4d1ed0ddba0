"""Shared CLI plumbing: one-line errors with exit code 2, never a traceback.

Exit codes (docs/cli.md): 0 no finding at or above --fail-on, 1 findings, 2 bad usage or
unreadable input (one line on stderr), 3 an internal error escaped (a bug: one line on stderr, the
traceback only with ``--debug`` or ``FRAGSCOPE_DEBUG=1``).
"""
from __future__ import annotations

import sys

import click

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_CRASH = 0, 1, 2, 3


class UsageError(click.ClickException):
    """Bad usage or unreadable input: printed as one line on stderr, exit code 2."""

    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:  # one line, no "Error:" box
        click.echo(f"{_prog()}: error: {self.format_message()}", err=True)


def _prog() -> str:
    import os

    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fragscope"


def fail(msg: str) -> "None":
    raise UsageError(msg.splitlines()[0] if msg else "error")
