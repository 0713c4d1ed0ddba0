"""The part of the command-line plumbing that needs no click: exit codes, one-line errors, the exit
without teardown and the progress bar. ``diagnose trace FILE`` runs on this alone (fragscope/cli/__init__.py);
fragscope/cli/common.py adds click's option types and re-exports these.

Exit codes (docs/cli.md#exit-codes): 0 no finding at or above --fail-on, 1 findings, 2 bad usage or
unreadable input (one line on stderr), 3 an internal error escaped (a bug: one line on stderr, the
traceback only with ``--debug`` or ``FRAGSCOPE_DEBUG=1``), 4 no finding at or above --fail-on but the
verdict is incomplete: a source it needed was down (``signals.sources_down``), never a silent 0.
"""
from __future__ import annotations

import os
import sys

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_CRASH, EXIT_SOURCES_DOWN = 0, 1, 2, 3, 4

_EXIT_WITHOUT_TEARDOWN = [False]


def exit_without_teardown() -> None:
    """The command has written all it writes and holds nothing that needs the interpreter's teardown (no
    thread, no file of its own left open): the console entry may end the process once stdout and stderr
    are flushed, without freeing every object and module first (``exit_now``)."""
    _EXIT_WITHOUT_TEARDOWN[0] = True


def exit_now(code: int) -> None:
    """End the process with ``code`` at once where the command allowed it (above), only this thread runs
    and no exit handler is registered, after flushing stdout and stderr; otherwise return, and the caller
    exits as usual. (A large trace's objects and numpy's modules take tens of ms to free at exit.)"""
    if not _EXIT_WITHOUT_TEARDOWN[0]:
        return
    import atexit
    import threading

    pending = getattr(atexit, "_ncallbacks", None)
    if threading.active_count() != 1 or pending is None or pending() != 0:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed pipe: the usual exit says what it says
        return
    os._exit(code)


def echo(text: str, err: bool = False) -> None:
    """One line on stdout (stderr with ``err``), as click.echo writes it. Without click loaded: written
    and flushed as it is when it has no ESC character (click would take ANSI styles out of it off a
    terminal); otherwise, or once click is loaded, click.echo itself."""
    if "\x1b" in text or "click" in sys.modules:
        import click

        click.echo(text, err=err)
        return
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


class CommandError(Exception):
    """Bad usage or unreadable input: printed as one line on stderr, exit code 2 (common.UsageError is
    this and click's exception at once; this alone is raised where click is not loaded)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def format_message(self) -> str:
        return self.message

    def show(self, file=None) -> None:  # one line, no "Error:" box
        echo(f"{prog_name()}: error: {self.format_message()}", err=True)


def fail(msg: str) -> "None":
    """Raise the command's one-line error (exit 2): click's kind (common.UsageError) where click is loaded,
    else a CommandError, which the console entry shows the same way."""
    text = msg.splitlines()[0] if msg else "error"
    if "click" in sys.modules:
        from .common import UsageError

        raise UsageError(text)
    raise CommandError(text)


def prog_name() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fragscope"


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
    from ..collectors.safefile import set_observer

    if sys.stderr.isatty() and not os.environ.get("NO_COLOR_PROGRESS"):
        set_observer(_progress_observer)
