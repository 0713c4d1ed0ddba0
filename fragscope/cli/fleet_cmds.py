"""``diagnose --prometheus URL``: diagnose every serving pod a Prometheus server knows (docs/fleet.md)."""
from __future__ import annotations

import json
import os
import sys
import time

import click

from .common import fail
from .render import json_default, fmt_ts, fmt_value, print_report, report_exit_code

_OPTS = ("prometheus", "since", "start", "end", "step", "selector", "bearer_token", "bearer_token_file",
         "basic_auth", "headers", "ca_bundle", "insecure", "prom_timeout")


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    """Fleet mode is an option set of ``diagnose`` (see fleet_options); no command of its own."""


def fleet_options(f):
    """Options of ``diagnose`` for Prometheus fleet mode (--prometheus, --since, --selector, ...)."""
    opts = [
        click.option("--prometheus", metavar="URL", default=None,
                     help="Diagnose the fleet a Prometheus-compatible server holds (Thanos, Mimir, "
                          "VictoriaMetrics: their Prometheus API prefix)."),
        click.option("--since", metavar="DURATION", default=None,
                     help="How far back: with --prometheus the window ending at --end [default: 6h]; with --agent "
                          "[default: 1h]. E.g. 6h, 90m."),
        click.option("--start", metavar="TIME", default=None, help="With --prometheus: window start, RFC 3339 or unix seconds."),
        click.option("--end", metavar="TIME", default=None, help="With --prometheus: window end, RFC 3339 or unix seconds. [default: now]"),
        click.option("--step", metavar="DURATION", default=None,
                     help="With --prometheus: resample at this step (query_range) instead of fetching raw samples."),
        click.option("--selector", metavar="MATCHERS", default=None,
                     help="With --prometheus: narrow the fleet, e.g. '{namespace=\"llm\",pod=~\"vllm-.*\"}'."),
        click.option("--bearer-token", metavar="TOKEN", default=None, envvar="FRAGSCOPE_PROMETHEUS_TOKEN",
                     help="With --prometheus: send 'Authorization: Bearer TOKEN' (env FRAGSCOPE_PROMETHEUS_TOKEN)."),
        click.option("--bearer-token-file", metavar="FILE", default=None,
                     help="With --prometheus: read the bearer token from FILE (e.g. a service-account token)."),
        click.option("--basic-auth", metavar="USER:PASS", default=None, help="With --prometheus: HTTP basic auth."),
        click.option("--header", "headers", metavar="'K: V'", multiple=True,
                     help="With --prometheus: extra request header (repeatable), e.g. 'X-Scope-OrgID: team-a'."),
        click.option("--ca-bundle", metavar="FILE", default=None, help="With --prometheus: CA bundle to verify TLS."),
        click.option("--insecure", is_flag=True, default=False, help="With --prometheus: do not verify TLS certificates."),
        click.option("--timeout", "prom_timeout", metavar="SECONDS", default=None,
                     help="With --prometheus: per-request timeout. [default: 30s]"),
        click.option("--triage", "triage", type=click.Choice(["auto", "rules", "queries", "off"]), default=None,
                     help="With --prometheus: level checks in PromQL first, deep fetch only for flagged targets: "
                          "from the recorded triage rules (rules), as queries (queries), whichever the server "
                          "has (auto), or off (download every series). [default: auto]"),
        click.option("--peers", "peers", type=click.IntRange(0, 1000), default=None,
                     help="With --prometheus: healthy targets deep-diagnosed beside the flagged ones. [default: 3]"),
        click.option("--deep-limit", "deep_limit", type=click.IntRange(1, 100000), default=None,
                     help="With --prometheus: at most this many targets deep-fetched. [default: 100]"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _config(opts: dict):
    from ..collectors.prometheus import PromConfig, parse_duration

    token = opts.get("bearer_token")
    tfile = opts.get("bearer_token_file")
    if tfile:
        if token:
            fail("give --bearer-token or --bearer-token-file, not both")
        try:
            with open(tfile, encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as e:
            fail(f"--bearer-token-file {tfile}: {e.strerror or e}")
        if not token:
            fail(f"--bearer-token-file {tfile}: file is empty")
    basic = None
    if opts.get("basic_auth"):
        user, sep, pw = opts["basic_auth"].partition(":")
        if not sep or not user:
            fail("--basic-auth: expected USER:PASS")
        basic = (user, pw)
    headers = {}
    for h in opts.get("headers") or ():
        k, sep, v = h.partition(":")
        if not sep or not k.strip() or any(c in k for c in " \t\r\n") or "\n" in v or "\r" in v:
            fail(f"--header {h!r}: expected 'Name: value'")
        headers[k.strip()] = v.strip()
    ca = opts.get("ca_bundle")
    if ca and not os.path.isfile(ca):
        fail(f"--ca-bundle {ca}: no such file")
    if ca and opts.get("insecure"):
        fail("give --ca-bundle or --insecure, not both")
    timeout = 30.0
    if opts.get("prom_timeout") is not None:
        try:
            timeout = parse_duration(opts["prom_timeout"])
        except ValueError as e:
            fail(f"--timeout: {e}")
    url = opts["prometheus"]
    from ..collectors.endpoint import EndpointError, looks_like_url, normalise

    if looks_like_url(url) and "://" not in url:  # host:port, as every other URL option takes it
        try:
            url = normalise(url)
        except EndpointError as e:
            fail(f"--prometheus: {e}")
    return PromConfig(url, bearer_token=token, basic_auth=basic, headers=headers,
                      ca_bundle=ca, insecure=bool(opts.get("insecure")), timeout=timeout)


def window_from_opts(opts: dict, now: float | None = None) -> tuple[float, float, float | None]:
    """(start, end, step) from --since/--start/--end/--step; one-line errors."""
    from ..collectors.prometheus import parse_duration, parse_time

    now = time.time() if now is None else now
    try:
        end = parse_time(opts["end"]) if opts.get("end") else now
    except ValueError as e:
        fail(f"--end: {e}")
    if opts.get("start") and opts.get("since"):
        fail("give --since or --start, not both")
    if opts.get("start"):
        try:
            start = parse_time(opts["start"])
        except ValueError as e:
            fail(f"--start: {e}")
    else:
        try:
            start = end - parse_duration(opts.get("since") or "6h")
        except ValueError as e:
            fail(f"--since: {e}")
    if start >= end:
        fail(f"empty window: --start {fmt_ts(start)} is not before --end {fmt_ts(end)}")
    step = None
    if opts.get("step"):
        try:
            step = parse_duration(opts["step"])
        except ValueError as e:
            fail(f"--step: {e}")
    return start, end, step


def run_fleet(ctx: click.Context, fmt: str, fail_on: str, **opts) -> "int | None":
    """Run a fleet diagnosis and return the exit code, or None when --prometheus was not given."""
    if not opts.get("prometheus"):
        used = [n for n in ("start", "end", "step", "selector", "bearer_token", "bearer_token_file",
                            "basic_auth", "ca_bundle", "prom_timeout", "triage", "peers", "deep_limit")
                if opts.get(n) is not None and opts.get(n) is not False and opts.get(n) != ()]
        if used or opts.get("headers") or opts.get("insecure"):
            name = (used[0] if used else "header").replace("prom_", "").replace("_", "-")
            fail(f"--{name} needs --prometheus URL")
        return None
    if ctx.params.get("file"):
        fail("give a recording FILE or --prometheus URL, not both")
    if opts.get("agent") or opts.get("vllm") or opts.get("dcgm"):
        fail("give --prometheus URL or a live source (--agent, --vllm, --dcgm), not both")
    bar = _FleetBar() if sys.stderr.isatty() else None
    try:
        report = fleet_report(opts, progress=bar)
    finally:
        if bar is not None:
            bar.stop()
    if fmt == "json":
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=json_default) + "\n")
    else:
        render_fleet(report, sys.stdout)
    rcs = [report_exit_code(t.report, fail_on) for t in report.targets if t.report is not None]
    return max(rcs, default=0)


def fleet_report(opts: dict, progress=None):
    """The FleetReport of ``diagnose --prometheus URL`` from its options (triage, then the flagged targets)."""
    from ..collectors.prometheus import PrometheusClient, PrometheusError, parse_selector
    from ..fleet import DEEP_LIMIT, PEER_SAMPLE, diagnose_fleet

    start, end, step = window_from_opts(opts)
    selector = opts.get("selector")
    try:
        parse_selector(selector)
    except ValueError as e:
        fail(f"--selector: {e}")
    cfg = _config(opts)
    try:
        client = PrometheusClient(cfg)
        return diagnose_fleet(client, start, end, selector=selector, step=step, triage=opts.get("triage") or "auto",
                              peers=PEER_SAMPLE if opts.get("peers") is None else opts["peers"],
                              deep_limit=opts.get("deep_limit") or DEEP_LIMIT, progress=progress)
    except PrometheusError as e:
        fail(str(e))


class _FleetBar:
    """A transient progress bar on stderr over the targets the fleet mode deep-fetches."""

    def __init__(self) -> None:
        self._p = self._task = None

    def __call__(self, i: int, n: int, target: str) -> None:
        if self._p is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._p = Progress(TextColumn("deep fetch {task.description}"), BarColumn(), MofNCompleteColumn(),
                               console=Console(stderr=True), transient=True)
            self._task = self._p.add_task(target, total=n)
            self._p.start()
        self._p.update(self._task, completed=i, description=target)

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()


def render_fleet(report, out) -> None:
    """Fleet summary: one line per target with its top finding, outliers, gaps, then details."""
    w = out.write
    w(f"fragscope fleet diagnosis of {report.source}  window {fmt_ts(report.window[0])} → "
      f"{fmt_ts(report.window[1])}\n")
    w(f"{len(report.targets)} targets, {report.series} series, {report.queries} queries in "
      f"{report.fetch_seconds:.1f} s ({report.mode}{'' if report.step is None else f', step {report.step:g} s'})\n")
    tri = report.triage or {"mode": "off"}
    if tri.get("mode") != "off":
        w(f"triage ({tri['mode']}, {tri['queries']} queries, {tri['seconds']:.1f} s): {tri['flagged']} flagged, "
          f"{tri['outliers']} outlying, {tri['peers_sampled']} healthy peers sampled; {tri['examined']} of "
          f"{tri['fleet_targets']} targets deep-diagnosed\n")
    w("\n")
    rows = [("TARGET", "MODEL", "TOP FINDING", "SEV", "CONF", "TOK/S", "FRAG")]
    clear = [t for t in report.targets if t.status == "triage-clear"]
    for t in report.ordered():
        top = t.top
        if t.status == "triage-clear" and len(clear) > 20:
            continue
        if t.status in ("triage-clear", "flagged"):
            what = "triage clear" if not t.flags else "flagged: " + ", ".join(dict.fromkeys(f.check for f in t.flags))
            sev, conf = "-", "-"
        elif t.error:
            what, sev, conf = "error: see below", "-", "-"
        elif top is not None:
            what, sev, conf = top.id, top.severity.value, f"{top.confidence:.2f}"
        elif t.status == "inconclusive":
            what, sev, conf = "inconclusive", "-", "-"
        else:
            what, sev, conf = "no finding", "-", "-"
        rows.append((str(t.id), _trim(t.model or "-", 28), what, sev, conf,
                     "-" if t.throughput is None else f"{t.throughput:,.0f}",
                     "-" if t.fragmentation is None else fmt_value(t.fragmentation, "ratio")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        w("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() + "\n")
    if len(clear) > 20:
        w(f"... and {len(clear)} targets that passed every triage check (listed with --format json)\n")
    if report.outliers:
        w("\nOutliers against peers serving the same model (robust z-score):\n")
        for o in report.outliers:
            unit = "ratio" if o.metric == "fragmentation_ratio" else "tok/s"
            val = fmt_value(o.value, unit) if unit == "ratio" else f"{o.value:,.0f} tok/s"
            med = fmt_value(o.peer_median, unit) if unit == "ratio" else f"{o.peer_median:,.0f} tok/s"
            w(f"  {o.target}: {o.metric} {val} vs peer median {med} ({o.direction}, z={o.robust_z:+.1f}, "
              f"{o.peers} pods of {o.model})\n")
    if report.missing_everywhere:
        w(f"\nMissing on every target: {', '.join(report.missing_everywhere)}\n")
    for n in report.notes:
        w(f"note: {n}\n")
    for t in report.ordered():
        if t.error:
            w(f"\n── {t.id}: {t.error}\n")
            continue
        if t.top is None:
            continue
        w(f"\n── {t.id} " + "─" * max(0, 60 - len(str(t.id))) + "\n")
        extra = [m for m in t.missing_signals if m not in report.missing_everywhere]
        if extra:
            w(f"missing here: {', '.join(extra)}\n")
        out.flush()
        print_report(t.report, "human", file=out)
    w("\nFull reports: --format json\n")


def _trim(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


__all__ = ["register", "fleet_options", "run_fleet", "window_from_opts", "render_fleet"]
