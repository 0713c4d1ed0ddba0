"""``diagnose FILE`` / live / fleet, ``diagnose explain ID`` and ``fragscope kv-budget``."""
from __future__ import annotations

import json

import click

from ..model import Report, Severity
from . import agent_cmds, fleet_cmds
from .common import EXIT_FINDINGS, EXIT_OK, fail
from .render import print_report, report_exit_code

FORMATS = click.Choice(["human", "json"])
FAIL_ON = click.Choice(["info", "warning", "critical", "never"])


def _diagnose_file(path: str):
    from ..collectors.exposition import ParseError, read_recording
    from ..pipeline import diagnose

    try:
        window = read_recording(path)
    except ParseError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{path}: {e.strerror or e}")
    return window, diagnose(window)


@click.command("run", context_settings={"ignore_unknown_options": False})
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=FORMATS, default="human", show_default=True, help="Output format.")
@click.option("--fail-on", type=FAIL_ON, default="critical", show_default=True,
              help="Exit 1 when a finding is at or above this severity.")
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None,
              help="Also write a self-contained HTML report (timeline, findings, playbooks) to this file.")
@click.option("--no-color", is_flag=True, help="Plain text even on a terminal (NO_COLOR works too).")
@agent_cmds.live_options
@fleet_cmds.fleet_options
@click.pass_context
def run_cmd(ctx: click.Context, file: str | None, fmt: str, fail_on: str, html: str | None, no_color: bool,
            **opts) -> int:
    """Diagnose a recording FILE (OpenMetrics / Prometheus text with timestamps, .gz too),
    a running agent (--agent), a live server (--vllm), or a fleet (--prometheus)."""
    if html and opts.get("prometheus"):
        fail("--html is for one target (a recording, --agent or --vllm), not a fleet (--prometheus)")
    rc = fleet_cmds.run_fleet(ctx, fmt=fmt, fail_on=fail_on, **opts)
    if rc is not None:
        return rc
    if file:
        window, report = _diagnose_file(file)
    else:
        window = agent_cmds.run_live(ctx, **opts)
        if window is None:
            fail("nothing to diagnose: give a recording FILE, --agent URL, --vllm URL or --prometheus URL "
                 "(see diagnose --help)")
        from ..pipeline import diagnose

        report = diagnose(window)
    print_report(report, fmt, window=window, color=False if no_color else None, html=html)
    return report_exit_code(report, fail_on)


@click.command("explain")
@click.argument("diagnosis_id")
@click.option("--format", "fmt", type=FORMATS, default="human", show_default=True)
def explain_cmd(diagnosis_id: str, fmt: str) -> int:
    """Print the playbook of a diagnosis (e.g. allocator-fragmentation)."""
    from ..playbooks import PLAYBOOKS, render_playbook_text

    pb = PLAYBOOKS.get(diagnosis_id)
    if pb is None:
        fail(f"unknown diagnosis {diagnosis_id!r}; known: {', '.join(sorted(PLAYBOOKS))}")
    if fmt == "json":
        click.echo(json.dumps(pb.to_dict(), indent=2))
    else:
        click.echo(render_playbook_text(pb))
    return EXIT_OK


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    diagnose_group.add_command(run_cmd)
    diagnose_group.add_command(explain_cmd)


__all__ = ["register", "Report", "Severity", "EXIT_FINDINGS"]
