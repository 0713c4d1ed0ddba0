"""Shared CLI plumbing: one-line errors with exit code 2, never a traceback."""
from __future__ import annotations

import sys

import click

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


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
