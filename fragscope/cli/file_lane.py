"""A plain ``diagnose FILE`` told apart without click, so that the file's parse can start in a child process
before click, numpy and the detectors are imported (fragscope/collectors/prefetch.py). click still reads the
command line and runs the command; the command takes the child's result when it reads that same FILE with
the reader's defaults (diagnose_cmd.py), and reads the file itself otherwise."""
from __future__ import annotations

import os

# Options of the default command that do not change how FILE is read (the values click accepts for the
# choices: diagnose_cmd.FORMATS and FAIL_ON); any other option, or a second argument, and click alone reads.
_CHOICES = {"--format": ("human", "json"), "--fail-on": ("info", "warning", "critical", "never"),
            "--since": None, "--html": None}
_FLAGS = ("--no-color",)


def plain_file(args: list[str]) -> str | None:
    """FILE when ``args`` (after ``diagnose``) is one existing regular file not starting with '-', with
    at most one each of --format, --fail-on, --since, --html (a separate value) and --no-color; else None."""
    if not args or len(args) > 10:
        return None
    seen, files, i = set(), [], 0
    while i < len(args):
        a = args[i]
        if a in seen:
            return None
        if a in _FLAGS:
            seen.add(a)
            i += 1
            continue
        if a in _CHOICES:
            if i + 1 == len(args):
                return None
            v, allowed = args[i + 1], _CHOICES[a]
            if (allowed is not None and v not in allowed) or not v or v.startswith("-"):
                return None
            seen.add(a)
            i += 2
            continue
        if not a or a.startswith("-"):
            return None
        files.append(a)
        i += 1
    if len(files) != 1 or not os.path.isfile(files[0]):
        return None
    return files[0]


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
