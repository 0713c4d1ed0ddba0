"""``diagnose trace FILE``: kernel-timeline verdicts from an nsys SQLite export or a Kineto JSON trace."""
from __future__ import annotations

import click

from .common import ByteSize
from .trace_run import (FAIL_ON_CHOICES, FAIL_ON_DEFAULT, FORMAT_CHOICES, FORMAT_DEFAULT,  # noqa: F401 (re-exported)
                        analyse_trace, reuse_freed_memory, run_trace, small_pages, trace_json, trace_report)

FORMATS = click.Choice(list(FORMAT_CHOICES))
FAIL_ON = click.Choice(list(FAIL_ON_CHOICES))


@click.command("trace")
@click.argument("file", nargs=-1, required=True, type=click.Path(), metavar="FILE...")
@click.option("--format", "fmt", type=FORMATS, default=FORMAT_DEFAULT, show_default=True, help="Output format.")
@click.option("--fail-on", type=FAIL_ON, default=FAIL_ON_DEFAULT, show_default=True,
              help="Exit 1 when a finding is at or above this severity.")
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None,
              help="Also write a self-contained HTML report (busy/idle share, gaps, findings) to this file.")
@click.option("--max-json-bytes", type=ByteSize(), default=None,
              help="Cap on a JSON trace's size after decompression, e.g. 2GiB (default 1 GiB; reading takes about 5 bytes "
                   "of memory per byte of JSON).")
def trace_cmd(file, fmt: str, fail_on: str, html: str | None = None, max_json_bytes: int | None = None) -> int:
    """Analyse a kernel timeline FILE: an Nsight Systems SQLite export (nsys export --type sqlite)
    or a PyTorch profiler / Kineto JSON trace (.json, .json.gz). Format detected by content.

    Several files, or a directory of them: the Kineto traces of the ranks of one job, aligned on their
    collectives to find a straggling rank."""
    return run_trace(file, fmt, fail_on, html, max_json_bytes)


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    """Attach this module's commands to the two entry points."""
    diagnose_group.add_command(trace_cmd)
