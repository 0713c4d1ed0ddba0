"""``diagnose FILE`` / live / fleet, ``diagnose explain ID`` and ``fragscope kv-budget``."""
from __future__ import annotations

import json
import os

import click

from ..model import Report, Severity
from . import agent_cmds, fleet_cmds
from .common import EXIT_FINDINGS, EXIT_OK, exit_without_teardown, fail
from .file_run import OtherKind, diagnose_path  # noqa: F401 (diagnose_path: also the MCP tools')
from .render import print_report, report_exit_code

FORMATS = click.Choice(["human", "json"])
FAIL_ON = click.Choice(["info", "warning", "critical", "never"])


def _reroute(ctx: click.Context, other: OtherKind, file: str, fmt: str, fail_on: str, html: str | None,
             refused: list[str]) -> int:
    """Whatever the on-call holds gets its answer: a log, a trace or a snapshot given to ``diagnose FILE``
    is read by its own subcommand (one note on stderr says so; stdout stays the report)."""
    if refused:
        fail(f"{other} ({' and '.join(refused)} appl{'y' if len(refused) > 1 else 'ies'} to metrics recordings)")
    from .logs_cmd import logs_cmd
    from .nvsmi_cmd import nvsmi_cmd
    from .snapshot_cmd import snapshot_cmd
    from .trace_cmd import trace_cmd

    cmd = {"logs": logs_cmd, "trace": trace_cmd, "snapshot": snapshot_cmd, "nvidia-smi": nvsmi_cmd}[other.reader]
    what = str(other).split(": ", 1)[-1].split(", not metrics text", 1)[0]
    kwargs = {"file": file, "fmt": fmt, "fail_on": fail_on}
    if html:
        if not any(p.name == "html" for p in cmd.params):
            fail(f"--html: diagnose {other.reader} has no HTML report")
        kwargs["html"] = html
    rc = ctx.invoke(cmd, **kwargs)
    # after the report, so that an input error stays the one line the subcommand printed
    click.echo(f"diagnose: {file}: {what}; read as: diagnose {other.reader} {file}", err=True)
    return rc


@click.command("run", context_settings={"ignore_unknown_options": False})
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=FORMATS, default="human", show_default=True, help="Output format.")
@click.option("--fail-on", type=FAIL_ON, default="critical", show_default=True,
              help="Exit 1 when a finding is at or above this severity.")
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None,
              help="Also write a self-contained HTML report (timeline, findings, playbooks) to this file.")
@click.option("--no-color", is_flag=True, help="Plain text even on a terminal (NO_COLOR works too).")
@click.option("--scrape-interval", metavar="DURATION", default=None,
              help="With a FILE of scrapes without timestamps (curl output): the time between them. "
                   "[default: the reader's]")
@agent_cmds.live_options
@fleet_cmds.fleet_options
@click.pass_context
def run_cmd(ctx: click.Context, file: str | None, fmt: str, fail_on: str, html: str | None, no_color: bool,
            scrape_interval: str | None, **opts) -> int:
    """Diagnose a recording or scrape FILE (OpenMetrics / Prometheus text, .gz too), a live URL
    (vLLM, SGLang, dcgm-exporter or a fragscope agent: http://host:port or host:port), a running
    agent (--agent), a live server (--vllm), or a fleet (--prometheus)."""
    from ..collectors.address import looks_like_url

    if html and opts.get("prometheus"):
        fail("--html is for one target (a recording, --agent or --vllm), not a fleet (--prometheus)")
    color = False if no_color else None
    if file and not os.path.exists(file) and looks_like_url(file):
        return agent_cmds.diagnose_url(file, fmt, fail_on, scrape_interval=scrape_interval, color=color,
                                       html=html, **opts)
    rc = fleet_cmds.run_fleet(ctx, fmt=fmt, fail_on=fail_on, **opts)
    if rc is not None:
        return rc
    if file and (opts.get("agent") or opts.get("vllm") or opts.get("dcgm")):
        fail("give a recording FILE or a live source (--agent, --vllm, --dcgm), not both")
    if not file and (opts.get("vllm") or opts.get("dcgm")):
        if scrape_interval:
            fail("--scrape-interval applies to a scrape FILE without timestamps")
        return agent_cmds.diagnose_sources(fmt, fail_on, color=color, html=html, **opts)
    if file:
        if opts.get("duration") or opts.get("interval"):
            fail("--duration and --interval sample a live source; a FILE is read as recorded (--since "
                 "keeps its last DURATION)")
        try:
            window, report = diagnose_path(file, opts.get("since"), scrape_interval)
        except OtherKind as other:
            refused = [f for f, v in (("--since", opts.get("since")), ("--scrape-interval", scrape_interval)) if v]
            return _reroute(ctx, other, file, fmt, fail_on, html, refused)
    else:
        if scrape_interval:
            fail("--scrape-interval applies to a scrape FILE without timestamps")
        window = agent_cmds.run_live(ctx, **opts)
        if window is None:
            fail("nothing to diagnose: give a recording FILE, a URL (http://host:port), --agent URL, "
                 "--vllm URL or --prometheus URL (see diagnose --help)")
        if opts.get("agent"):
            from ..agent.client import agent_base

            report = agent_cmds.agent_verdict(window, agent_base(opts["agent"]))
        else:
            from ..pipeline import diagnose

            report = diagnose(window)
    print_report(report, fmt, window=window, color=color, html=html)
    if file:  # one file read and closed, the report written: the process may end without its teardown
        exit_without_teardown()  # (freeing numpy's and every module's objects: 30-70 ms of diagnose FILE)
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
