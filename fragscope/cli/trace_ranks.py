"""``diagnose trace DIR`` / ``diagnose trace FILE FILE ...``: several ranks' Kineto traces of one job, aligned
on their collectives (rank-straggler). Contract: docs/trace.md ("Several ranks")."""
from __future__ import annotations

import sys

import click

from .common import dumps_json, fail
from .render import fmt_value, render_human, report_exit_code
from .trace_cmd import trace_json, trace_report


def ranks_cmd(paths: list[str], fmt: str, fail_on: str, html: str | None, max_json_bytes: int | None) -> int:
    from ..collectors.trace_io import DEFAULT_MAX_JSON_BYTES
    from ..ranks_pipeline import analyse_rank_files

    if html:
        fail("--html: the per-rank analysis (several traces) has no HTML report; use --format json")
    a, findings, report = trace_report(
        lambda: analyse_rank_files(paths, max_json_bytes=max_json_bytes or DEFAULT_MAX_JSON_BYTES),
        ", ".join(paths), paths[0])
    if fmt == "json":
        sys.stdout.write(dumps_json(trace_json(a, findings)) + "\n")
    else:
        _print_ranks(a)
        render_human(report, sys.stdout)
    return report_exit_code(report, fail_on)


def _print_ranks(a: dict) -> None:
    echo = click.echo
    echo(f"{len(a['ranks'])} ranks, {len(a['collectives'])} collectives aligned")
    echo(f"{'rank':>5} {'gpu':>4} {'colls':>6} {'last':>5} {'in NCCL':>9} {'waiting':>9} {'wait %':>7} "
         f"{'of span':>8} {'compute before':>15}  trace")
    for r in a["ranks"]:
        echo(f"{r['rank']:>5} {r['device'] if r['device'] is not None else '-':>4} {r['collectives']:>6} "
             f"{r['last_arrivals']:>5} {fmt_value(r['collective_seconds'], 'seconds'):>9} "
             f"{fmt_value(r['wait_seconds'], 'seconds'):>9} {fmt_value(r['wait_ratio'], 'ratio'):>7} "
             f"{fmt_value(r['lost_ratio'], 'ratio'):>8} {fmt_value(r['compute_before_seconds'], 'seconds'):>15}  "
             f"{r['source']}")
    for n in a.get("notes", []):
        echo(f"note: {n}")
    echo("")
