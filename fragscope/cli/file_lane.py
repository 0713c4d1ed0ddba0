"""A plain ``diagnose FILE`` told apart without click, so that the file's parse can start in a child process
before numpy and the detectors are imported (fragscope/collectors/prefetch.py), and, with at most --format,
--fail-on and --no-color, run without click (:func:`run`); with --since or --html click reads the command
line and runs the command. Either takes the child's result when it reads that same FILE with the reader's
defaults (file_run.py), and reads the file itself otherwise."""
from __future__ import annotations

import os

# Options of the default command that do not change how FILE is read (the values click accepts for the
# choices: diagnose_cmd.FORMATS and FAIL_ON); any other option, or a second argument, and click alone reads.
_CHOICES = {"--format": ("human", "json"), "--fail-on": ("info", "warning", "critical", "never"),
            "--since": None, "--html": None}
_FLAGS = ("--no-color",)


def plain_args(args: list[str]) -> dict | None:
    """{"file": FILE, option: value...} when ``args`` (after ``diagnose``) is one existing regular file not
    starting with '-', with at most one each of --format, --fail-on, --since, --html (a separate value) and
    --no-color (value True); else None."""
    if not args or len(args) > 10:
        return None
    seen, files, i = {}, [], 0
    while i < len(args):
        a = args[i]
        if a in seen:
            return None
        if a in _FLAGS:
            seen[a] = True
            i += 1
            continue
        if a in _CHOICES:
            if i + 1 == len(args):
                return None
            v, allowed = args[i + 1], _CHOICES[a]
            if (allowed is not None and v not in allowed) or not v or v.startswith("-"):
                return None
            seen[a] = v
            i += 2
            continue
        if not a or a.startswith("-"):
            return None
        files.append(a)
        i += 1
    if len(files) != 1 or not os.path.isfile(files[0]):
        return None
    seen["file"] = files[0]
    return seen


def plain_file(args: list[str]) -> str | None:
    """FILE when ``args`` is a plain ``diagnose FILE`` (:func:`plain_args`), else None."""
    plain = plain_args(args)
    return plain["file"] if plain else None


def run(args: list[str], prog: str) -> int | None:
    """Run a plain ``diagnose FILE`` with at most --format, --fail-on and --no-color without click (its run:
    cli/file_run.py; click and the commands' registration are ~50 ms of the process) and return its exit
    code; None when the command line is another, or FILE turns out to be another subcommand's input (click
    runs it then)."""
    plain = plain_args(args)
    if plain is None or "--since" in plain or "--html" in plain:
        return None
    from . import lane_call, lane_streams

    if not lane_streams():
        return None
    from .base import install_progress
    from .file_run import run_file
    from .trace_run import FAIL_ON_DEFAULT, FORMAT_DEFAULT

    install_progress()  # a bar on stderr while reading a large input, on a terminal only
    return lane_call(prog, run_file, plain["file"], plain.get("--format", FORMAT_DEFAULT),
                     plain.get("--fail-on", FAIL_ON_DEFAULT), bool(plain.get("--no-color")))


def prefetch(args: list[str]) -> bool:
    """Start reading FILE in a child process when ``args`` is a plain ``diagnose FILE`` (above) and it pays;
    True when one was started (then :func:`abandon` at the end of the command)."""
    file = plain_file(args)
    if file is None:
        return False
    from ..collectors.prefetch import start

    return start(file)


def abandon() -> None:
    """End a child whose file the command did not read (it failed first)."""
    from ..collectors.prefetch import abandon as end_children

    end_children()
