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

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_CRASH, EXIT_SOURCES_DOWN = 0, 1, 2, 3, 4


class UsageError(click.ClickException):
    """Bad usage or unreadable input: printed as one line on stderr, exit code 2."""

    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:  # one line, no "Error:" box
        click.echo(f"{_prog()}: error: {self.format_message()}", err=True)


def _prog() -> str:
    import os

    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fragscope"


from ..units import json_safe  # noqa: E402,F401  (re-exported: the CLI writes JSON through it)


def fail(msg: str) -> "None":
    raise UsageError(msg.splitlines()[0] if msg else "error")


def dumps_json(obj, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj`` (no NaN/Infinity tokens, ever): see :func:`json_safe`."""
    import json

    return json.dumps(json_safe(obj), indent=indent, allow_nan=False)


def _progress_observer(size: int, path: str):
    """rich's transient progress bar on stderr for one input: (advance(n), done())."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(TextColumn("reading {task.description}"), BarColumn(), DownloadColumn(),
                        TimeRemainingColumn(), console=Console(stderr=True), transient=True)
    task = progress.add_task(os.path.basename(path), total=size)
    progress.start()
    return (lambda n: progress.advance(task, n)), progress.stop


def install_progress() -> None:
    """Show a progress bar while a command reads a large input, when stderr is a terminal."""
    import sys

    from ..collectors.safefile import set_observer

    if sys.stderr.isatty() and not os.environ.get("NO_COLOR_PROGRESS"):
        set_observer(_progress_observer)
