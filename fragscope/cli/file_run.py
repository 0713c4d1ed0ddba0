"""``diagnose FILE`` for a recording or a scrape, without click: the file's read and diagnosis
(:func:`diagnose_path`, which the click command in diagnose_cmd.py calls too) and the plain command line's
whole run (:func:`run_file`: ``diagnose FILE`` with at most --format, --fail-on and --no-color, which the
console entry runs without importing click: cli/file_lane.py).
"""
from __future__ import annotations

import math

from .base import exit_without_teardown, fail
from .render import print_report, report_exit_code


class OtherKind(Exception):
    """FILE is something another ``diagnose`` subcommand reads (an engine log, a trace, a snapshot)."""

    def __init__(self, reader: str, message: str) -> None:
        super().__init__(message)
        self.reader = reader


def _duration(value: str, flag: str) -> float | None:
    from .agent_cmds import parse_duration_flag  # (click: only --since and --scrape-interval come here)

    return parse_duration_flag(value, flag)


def read_file(path: str, scrape_interval: str | None):
    """The window of the recording or scrape ``path`` (the console entry's child's parse when it made
    one: collectors/prefetch.py). Raises OtherKind for a file another subcommand reads; a one-line error
    (exit 2) for anything else wrong with it."""
    from ..collectors.exposition import ParseError, read_recording

    kwargs = {}
    if scrape_interval:  # the spacing of scrapes saved without timestamps (curl output)
        kwargs["scrape_interval_s"] = _duration(scrape_interval, "--scrape-interval")
    try:
        if not kwargs:
            from ..collectors.prefetch import read as read_prefetched

            window = read_prefetched(path)  # the console entry's child parsed it (cli/file_lane.py)
            if window is not None:
                return window
        return read_recording(path, **kwargs)
    except ParseError as e:
        if e.reader:
            raise OtherKind(e.reader, str(e)) from None
        fail(str(e))
    except OSError as e:
        fail(f"{path}: {e.strerror or e}")


def diagnose_path(path: str, since: str | None = None, scrape_interval: str | None = None):
    """A recording or scrape FILE; ``since`` keeps its last DURATION (ending at its last sample).
    Returns (window, report)."""
    from ..collectors.prefetch import pending
    from ..pipeline import diagnose, load_detectors

    if not scrape_interval and pending(path):
        load_detectors()  # while the console entry's child parses the file (imports it would do after the read)
    window = read_file(path, scrape_interval)
    if since:
        secs = _duration(since, "--since")
        end = window.end
        if end is None or not math.isfinite(end):
            fail(f"{path}: --since needs timestamps; the file has none")
        kept = window.between(end - secs, end)
        if not kept.series:
            fail(f"{path}: no samples in its last {since}")
        kept.notes.append(f"--since {since}: judged on the recording's last {secs:g} s "
                          f"(of {end - window.start:.0f} s)")
        window = kept
    return window, diagnose(window)


def run_file(path: str, fmt: str, fail_on: str, no_color: bool) -> int | None:
    """The plain ``diagnose FILE``'s run as the click command runs it; None when FILE is another
    subcommand's input (a log, a trace, a snapshot: click's command reroutes it, with its note)."""
    try:
        window, report = diagnose_path(path)
    except OtherKind:
        return None
    print_report(report, fmt, window=window, color=False if no_color else None)
    exit_without_teardown()  # (one file read and closed, the report written: as the click command)
    return report_exit_code(report, fail_on)
