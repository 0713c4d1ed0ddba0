"""Command line: ``diagnose`` (on-call) and ``fragscope`` (agent, record, kv-budget, capture...).

The click groups, their commands and their error handling live in ``groups`` (its names are this package's:
``from fragscope.cli import diagnose_group``). The console entries below import it for every command line
but the plainest two: ``diagnose trace FILE`` with at most ``--format`` and ``--fail-on`` (the command
line of a script or a notebook on one trace) runs the trace command's own function (trace_run.run_trace)
without importing click, which is about half of a small trace's start-up; ``diagnose FILE`` with at most
``--format``, ``--fail-on`` and ``--no-color`` runs file_run.run_file (file_lane.py). Anything else,
``--help`` and every error in reading the command line included, goes through click.
"""
from __future__ import annotations

import os
import sys

# Before anything imports numpy: fragscope's numpy work is element-wise (no large BLAS calls), and
# OpenBLAS's idle worker threads spin after each call. One thread: 0.10-0.18 s less CPU per
# `diagnose trace` of a 2 M-kernel export on the 2-core VM (interleaved runs); the agent does not
# keep spinning threads beside its collectors. A value the user set wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib

    groups = importlib.import_module(f"{__name__}.groups")  # (sets the attribute: asked once per name)
    try:
        return getattr(groups, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def plain_trace_args(args: list[str]) -> tuple[str, str, str] | None:
    """(file, format, fail_on) when ``args`` (after ``diagnose``) is ``trace FILE`` with at most one
    ``--format human|json`` and one ``--fail-on LEVEL``, in any order, FILE one existing path that is not a
    directory and does not start with '-'; None for every other command line (click reads those)."""
    from .trace_run import FAIL_ON_CHOICES, FAIL_ON_DEFAULT, FORMAT_CHOICES, FORMAT_DEFAULT

    if len(args) < 2 or len(args) > 6 or args[0] != "trace":
        return None
    opts, files, i = {}, [], 1
    while i < len(args):
        a = args[i]
        if a in ("--format", "--fail-on"):
            if a in opts or i + 1 == len(args):
                return None
            opts[a] = args[i + 1]
            i += 2
            continue
        if not a or a.startswith("-"):
            return None
        files.append(a)
        i += 1
    fmt, fail_on = opts.get("--format", FORMAT_DEFAULT), opts.get("--fail-on", FAIL_ON_DEFAULT)
    if len(files) != 1 or fmt not in FORMAT_CHOICES or fail_on not in FAIL_ON_CHOICES:
        return None
    if not os.path.isfile(files[0]):  # a directory, or no such file: click's path (its own messages)
        return None
    return files[0], fmt, fail_on


def lane_streams() -> bool:
    """A command may run without click here: not Windows, and stdout and stderr are text streams click would
    write to as they are (an encoding other than ASCII)."""
    import codecs

    if os.name == "nt":
        return False
    for s in (sys.stdout, sys.stderr):
        enc = getattr(s, "encoding", None)
        try:
            if s is None or not enc or codecs.lookup(enc).name == "ascii":
                return False
        except LookupError:
            return False
    return True


def trace_lane(args: list[str], prog: str) -> int | None:
    """Run a plain ``diagnose trace FILE`` (see :func:`plain_trace_args`) without click and return its exit
    code, handling its errors as groups.cli_exit_code does; None when the command line is not one."""
    if not lane_streams():
        return None
    plain = plain_trace_args(args)
    if plain is None:
        return None
    if not sys.stderr.isatty():  # (a terminal: the progress bar reads the file)
        from ..collectors.trace_io import prefetch_json_bytes

        prefetch_json_bytes(plain[0])  # a gzip trace inflates on another core while the modules load
    from .base import install_progress
    from .trace_run import run_trace

    install_progress()  # a bar on stderr while reading a large input, on a terminal only
    return lane_call(prog, run_trace, *plain)


def lane_call(prog: str, run, *args) -> int | None:
    """``run(*args)``, a command's own function run without click, with its errors answered as
    groups.cli_exit_code answers them; its exit code (None: the command line goes to click after all)."""
    from .base import CommandError

    try:
        rc = run(*args)
    except (EOFError, KeyboardInterrupt):  # as click's Command.main and then cli_exit_code answer them
        from .base import echo

        echo("", err=True)
        echo(f"{prog}: aborted", err=True)
        return 130
    except CommandError as e:
        e.show()
        return e.exit_code
    except OSError as e:
        import errno

        if e.errno != errno.EPIPE:
            return _crash(prog, e)
        from click.utils import PacifyFlushWrapper  # a closed pipe: exit 1 as click's Command.main does

        sys.stdout, sys.stderr = PacifyFlushWrapper(sys.stdout), PacifyFlushWrapper(sys.stderr)
        sys.exit(1)
    except Exception as e:  # noqa: BLE001 - as cli_exit_code: one line, exit 3, never a traceback
        return _crash(prog, e)
    return rc if isinstance(rc, int) or rc is None else 0


def _crash(prog: str, e: BaseException) -> int:
    from .groups import crash_exit_code, take_debug_flag

    return crash_exit_code(prog, e, take_debug_flag([])[1])


def _entry(prog: str, lane_args: list[str] | None) -> None:
    """Run the console entry ``prog``: ``lane_args`` (the arguments after ``diagnose``) through trace_lane or
    file_lane's run when given (a plain ``diagnose trace FILE`` or ``diagnose FILE``, without click), every
    other command line through click (a plain ``diagnose FILE`` starts reading its file in a child process
    first: file_lane)."""
    completing = f"_{prog.upper()}_COMPLETE" in os.environ  # click's shell completion asks the groups
    debug = "--debug" in (lane_args or ()) or os.environ.get("FRAGSCOPE_DEBUG")  # (a traceback shows the path)
    code = None
    from .file_lane import abandon, prefetch  # (not `from . import`: this package's __getattr__ loads click)
    from .file_lane import run as file_lane

    # a plain `diagnose FILE`: its parse starts in a child process while the rest loads
    child = lane_args is not None and not completing and prefetch(lane_args)
    if lane_args is not None and not completing and not debug:
        code = None if child else trace_lane(lane_args, prog)
        if code is None:
            code = file_lane(lane_args, prog)  # a plain `diagnose FILE` without click
        if child and code is not None:
            abandon()  # (nothing when the command took the child's result)
    if code is None:
        from .groups import diagnose_group, fragscope_group, run_and_exit

        try:
            run_and_exit(diagnose_group if prog == "diagnose" else fragscope_group, prog)
        finally:
            if child:
                abandon()
        return
    from .base import exit_now

    if 0 <= code <= 255:
        exit_now(code)  # (returns unless the command allowed it: base.exit_without_teardown)
    sys.exit(code)


def diagnose_main(lane: bool = True) -> None:
    """The ``diagnose`` console entry (``lane=False``: every command line through click, for the tests)."""
    _entry("diagnose", sys.argv[1:] if lane else None)


def main(lane: bool = True) -> None:
    """The ``fragscope`` console entry (``fragscope diagnose trace FILE`` as ``diagnose trace FILE``)."""
    args = sys.argv[1:]
    _entry("fragscope", args[1:] if lane and args[:1] == ["diagnose"] else None)
