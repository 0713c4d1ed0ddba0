"""``fragscope agent``, ``fragscope record``, and the live options of ``diagnose`` (--agent, --vllm).

Each command is a few library calls (fragscope/agent/); errors are one line with exit code 2.
Flags, config keys and environment variables: docs/agent.md.
"""
from __future__ import annotations

import os
import sys

import click

from ..agent.config import DEFAULT_LISTEN, DEFAULT_PORT
from .common import fail

MAX_LIVE_DURATION_S = 24 * 3600.0
MIN_INTERVAL_S = 0.2


def parse_duration_flag(value: str | None, flag: str, default: str | None = None) -> float | None:
    from ..agent.config import ConfigError, parse_duration

    v = value if value not in (None, "") else default
    if v is None:
        return None
    try:
        return parse_duration(v, flag)
    except ConfigError as e:
        fail(str(e))
    return None


# ---------------------------------------------------------------------------------------------
@click.command("agent")
@click.option("--config", "config_file", metavar="FILE", default=None,
              help="TOML config file (env FRAGSCOPE_CONFIG). Flags override env, env overrides the file.")
@click.option("--vllm", "vllm", metavar="URL", multiple=True,
              help="Engine address: http://host:8000, host:8000 or the /metrics URL (repeatable; vLLM, SGLang, TGI, "
                   "Triton).")
@click.option("--dcgm", metavar="URL", default=None,
              help="dcgm-exporter address, http://host:9400 or its /metrics URL (then NVML is off unless --nvml).")
@click.option("--listen", metavar="HOST:PORT", default=None, help=f"Exporter and API address. [default: {DEFAULT_LISTEN}]")
@click.option("--data-dir", metavar="DIR", default=None, help="History directory. [default: /var/lib/fragscope]")
@click.option("--interval", metavar="SECONDS", default=None, help="Default sampling interval, e.g. 1s, 5s. [default: 1s]")
@click.option("--probe-dir", metavar="DIR", default=None, help="Directory the in-engine probe publishes to.")
@click.option("--log-file", metavar="FILE", default=None, help="Engine log file to follow.")
@click.option("--nvml/--no-nvml", "nvml", default=None, help="Force the NVML collector on or off. [default: auto]")
@click.option("--nvml-recorded", metavar="FILE", default=None, help="Replay recorded NVML values (demo, tests).")
@click.option("--no-process", is_flag=True, default=False, help="Do not sample the engine processes.")
@click.option("--engine-pid", "engine_pids", metavar="PID", multiple=True, type=int,
              help="The engine's process id (repeatable; default: processes whose command mentions vllm).")
@click.option("--retention", metavar="DURATION", default=None, help="Keep history this long. [default: 7d]")
@click.option("--max-store-size", metavar="SIZE", default=None, help="Bound on the history on disk. [default: 1GiB]")
@click.option("--no-store", is_flag=True, default=False, help="Keep no history on disk (memory window only).")
@click.option("--detect-interval", metavar="DURATION", default=None, help="Run the detectors this often. [default: 30s]")
@click.option("--capture/--no-capture", "capture", default=None,
              help="Capture deep evidence (memory snapshots, traces) when a finding appears. [default: off]")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None)
@click.option("--print-config", is_flag=True, default=False, help="Print the effective config as TOML and exit.")
def agent_cmd(config_file, vllm, dcgm, listen, data_dir, interval, probe_dir, log_file, nvml, nvml_recorded,
              no_process, engine_pids, retention, max_store_size, no_store, detect_interval, capture, log_level,
              print_config) -> int:
    """Run the sidecar: sample, keep history, diagnose continuously, export to Prometheus."""
    from ..agent.config import ConfigError, load_config

    flags = {
        "vllm.urls": list(vllm) or None, "dcgm.url": dcgm, "listen": listen, "data_dir": data_dir,
        "interval": interval, "torch.probe_dir": probe_dir, "logs.file": log_file,
        "nvml.enabled": None if nvml is None else ("true" if nvml else "false"),
        "nvml.recorded": nvml_recorded, "process.enabled": False if no_process else None,
        "process.pids": list(engine_pids) or None, "store.retention": retention, "store.max_size": max_store_size,
        "store.enabled": False if no_store else None, "detect.interval": detect_interval,
        "capture.enabled": capture, "log_level": log_level,
    }
    try:
        cfg = load_config(config_file, os.environ, flags)
    except ConfigError as e:
        fail(str(e))
    if print_config:
        click.echo(cfg.to_toml(), nl=False)
        return 0
    _setup_logging(cfg.log_level)
    from ..agent.daemon import Agent
    from ..agent.store import StoreError

    agent = Agent(cfg)
    try:
        return agent.run()
    except StoreError as e:
        agent.close()
        fail(str(e))
    except OSError as e:
        agent.close()
        fail(f"cannot listen on {cfg.listen}: {e.strerror or e}; pick another --listen HOST:PORT")
    return 0


def _setup_logging(level: str) -> None:
    import logging

    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# ---------------------------------------------------------------------------------------------
@click.command("record")
@click.option("--vllm", "vllm", metavar="URL", multiple=True,
              help="Engine address: http://host:8000, host:8000 or the /metrics URL (repeatable).")
@click.option("--dcgm", metavar="URL", default=None, help="dcgm-exporter address or /metrics URL.")
@click.option("--agent", metavar="URL", default=None, help="Export a running agent's history instead of sampling.")
@click.option("--since", metavar="DURATION", default=None, help="With --agent: how far back. [default: 1h]")
@click.option("--duration", metavar="DURATION", default=None, help="How long to sample, e.g. 10m. [default: 2m]")
@click.option("--interval", metavar="DURATION", default=None, help="Sampling interval. [default: 5s]")
@click.option("-o", "--output", metavar="FILE", required=True,
              help="OpenMetrics file to write (.gz compresses; - for stdout).")
def record_cmd(vllm, dcgm, agent, since, duration, interval, output) -> int:
    """Record live signals as OpenMetrics with timestamps (read by `diagnose FILE` and promtool)."""
    window = _live_window(agent, vllm, dcgm, since, duration, interval, default_since="1h", allow_none=False)
    _write_recording(window, output)
    return 0


def _write_recording(window, output: str) -> None:
    import gzip
    import tempfile

    from ..agent.client import write_openmetrics

    if output == "-":
        n = write_openmetrics(window, sys.stdout)
        click.echo(f"record: {n} samples, {len(window)} series written to stdout", err=True)
        return
    d = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(d):
        fail(f"{output}: directory {d} does not exist")
    # write next to the target, then rename: never a half-written recording
    try:
        fd, tmp = tempfile.mkstemp(prefix=".record-", dir=d)
    except OSError as e:
        fail(f"{output}: cannot write ({e.strerror or e})")
    try:
        with os.fdopen(fd, "wb") as raw:
            if output.endswith(".gz"):
                with gzip.open(raw, "wt", encoding="utf-8") as fh:
                    n = write_openmetrics(window, fh)
            else:
                import io

                with io.TextIOWrapper(raw, encoding="utf-8") as fh:
                    n = write_openmetrics(window, fh)
        os.replace(tmp, output)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        fail(f"{output}: cannot write ({e.strerror or e})")
    click.echo(f"record: {n} samples, {len(window)} series written to {output}", err=True)


# ---------------------------------------------------------------------------------------------
def _live_window(agent, vllm, dcgm, since, duration, interval, default_since: str, allow_none: bool):
    from ..agent.client import ClientError, fetch_window, sample_live

    vllm = tuple(vllm or ())
    if agent and (vllm or dcgm):
        fail("give --agent URL or --vllm/--dcgm URL, not both")
    if agent:
        if duration:
            fail("--duration samples a live server (--vllm/--dcgm); with --agent use --since")
        since_s = parse_duration_flag(since, "--since", default_since)
        try:
            return fetch_window(agent, since_s)
        except ClientError as e:
            fail(str(e))
    if vllm or dcgm:
        dur = parse_duration_flag(duration, "--duration", "2m")
        # default: 5 s, or fewer seconds for a short --duration (at least 10 samples)
        ivl = parse_duration_flag(interval, "--interval", "5s") if interval else max(MIN_INTERVAL_S, min(5.0, dur / 10))
        if dur > MAX_LIVE_DURATION_S:
            fail(f"--duration: at most 24h (got {duration}); for longer, run `fragscope agent`")
        if ivl < MIN_INTERVAL_S:
            fail(f"--interval: at least {MIN_INTERVAL_S:g}s")
        if ivl > dur:
            fail("--interval is longer than --duration")
        # find each page first (/metrics when the path is empty): what cannot go away fails now,
        # not after --duration of failed rounds
        from ..agent.live import LiveError, resolve

        try:
            vllm = tuple(resolve(u).url for u in vllm)
            dcgm = resolve(dcgm).url if dcgm else None
        except LiveError as e:
            fail(str(e))
        import logging

        # the collectors' own warnings would repeat what tick() prints once per change
        logging.getLogger("fragscope.collectors").setLevel(logging.ERROR)
        targets = ", ".join([*vllm, *([dcgm] if dcgm else [])])
        click.echo(f"sampling {targets} every {ivl:g}s for {dur:g}s (Ctrl-C stops early and keeps what "
                   "was sampled)", err=True)
        last_err: list[str] = []

        def tick(r: int, got: int, errs: list[str]) -> None:
            if errs and errs != last_err:
                click.echo(f"  round {r}: {'; '.join(errs)[:300]}", err=True)
                last_err[:] = errs
        try:
            return sample_live(vllm, dcgm, dur, ivl, on_tick=tick)
        except ClientError as e:
            fail(str(e))
        except ImportError as e:
            fail(f"live sampling is not available in this build ({e})")
    if not allow_none:
        fail("nothing to record: give --vllm URL, --dcgm URL or --agent URL")
    if duration or interval:
        fail("--duration and --interval need --vllm URL or --dcgm URL")
    return None


def live_options(f):
    """Options of ``diagnose`` for live sources (--agent, --vllm, --dcgm, --duration, --since, --interval)."""
    have = {p.name for p in getattr(f, "__click_params__", [])}
    opts = [
        click.option("--agent", metavar="URL", default=None,
                     help=f"Diagnose from a running fragscope agent's history (e.g. http://pod:{DEFAULT_PORT})."),
        click.option("--vllm", "vllm", metavar="URL", multiple=True,
                     help="Sample a live vLLM /metrics for --duration, then diagnose (repeatable)."),
        click.option("--dcgm", metavar="URL", default=None, help="With --vllm: also sample a dcgm-exporter."),
        click.option("--duration", metavar="DURATION", default=None,
                     help="With --vllm/--dcgm: how long to sample, e.g. 2m, 90s. [default: 2m]"),
        click.option("--interval", metavar="DURATION", default=None,
                     help="With --vllm/--dcgm: sampling interval. [default: 5s]"),
    ]
    if "since" not in have:  # fleet mode may define --since already: one option serves both
        opts.append(click.option("--since", metavar="DURATION", default=None,
                                 help="With --agent: how far back to read. [default: 1h]"))
    for o in reversed(opts):
        f = o(f)
    return f


def run_live(ctx: click.Context, **opts) -> "object | None":
    """Return a Window sampled from a live source, or None when no live option was given."""
    live = opts.get("agent") or opts.get("vllm") or opts.get("dcgm")
    if live and ctx.params.get("file"):
        fail("give a recording FILE or a live source (--agent, --vllm, --dcgm), not both")
    return _live_window(opts.get("agent"), opts.get("vllm"), opts.get("dcgm"), opts.get("since"),
                        opts.get("duration"), opts.get("interval"), default_since="1h", allow_none=True)


def agent_verdict(window, base: str):
    """Diagnose a window read from an agent, with the agent's collector state: inconclusive
    reasons name a down source, a not-ready agent is said once on stderr (and in the notes), and
    every source that is down goes to ``signals.sources_down`` (the report's first line, exit 4)."""
    from ..agent.health import down_collectors, explain_down, sources_down
    from ..agent.live import agent_status
    from ..pipeline import diagnose

    status, ready = agent_status(base)
    if isinstance(ready, dict) and ready.get("status") == "not ready":
        why = "; ".join(str(r) for r in ready.get("reasons") or []) or "no reason given"
        window.notes.append(f"agent not ready: {why}")
        click.echo(f"agent {base}: not ready: {why}"[:500], err=True)
    report = diagnose(window)
    if isinstance(status, dict) and isinstance(status.get("collectors"), list):
        explain_down(report, down_collectors(c for c in status["collectors"] if isinstance(c, dict)))
    down = sources_down(status, ready)
    if down:
        report.signals["sources_down"] = down
    return report


def _fmt_elapsed(s: float) -> str:
    s = int(s)
    return f"{s // 60}:{s % 60:02d}"


def diagnose_url(arg: str, fmt: str, fail_on: str, color: bool | None = None, html: str | None = None,
                 **opts) -> int:
    """``diagnose URL``: a vLLM / SGLang server, a dcgm-exporter or a fragscope agent (docs/cli.md#live).

    A first verdict after two scrapes (stderr), refined until --duration or Ctrl-C; the final
    report on stdout. Errors that cannot go away fail at once (exit 2)."""
    from ..agent.client import ClientError, fetch_window
    from ..agent.live import LiveError, resolve
    from .render import print_report, report_exit_code

    if opts.get("agent") or opts.get("vllm") or opts.get("dcgm") or opts.get("prometheus"):
        fail("give a URL or a live option (--agent, --vllm, --dcgm, --prometheus), not both")
    if opts.get("scrape_interval"):
        fail("--scrape-interval applies to a scrape FILE without timestamps, not to a live URL")
    try:
        target = resolve(arg)
    except LiveError as e:
        fail(str(e))
    if target.is_agent:
        if opts.get("duration") or opts.get("interval"):
            fail(f"{target.base} is a fragscope agent: it has history, use --since (not --duration/--interval)")
        since_s = parse_duration_flag(opts.get("since"), "--since", "1h")
        click.echo(f"{target.base}: fragscope agent; reading its last {since_s:g} s of history", err=True)
        try:
            window = fetch_window(target.base, since_s)
        except ClientError as e:
            fail(str(e))
        report = agent_verdict(window, target.base)
        print_report(report, fmt, window=window, color=color, html=html)
        return report_exit_code(report, fail_on)
    if opts.get("since"):
        fail("--since reads history (a FILE or an agent); a live page is sampled from now: use --duration")
    return _watch_targets([target], fmt, fail_on, opts.get("duration"), opts.get("interval"), color, html)


def diagnose_sources(fmt: str, fail_on: str, color: bool | None = None, html: str | None = None, **opts) -> int:
    """``diagnose --vllm URL [--vllm URL ...] [--dcgm URL]``: each URL found and recognised like
    ``diagnose URL`` (``/metrics`` tried when the path is empty; errors that cannot go away fail at
    once), then sampled together with a first verdict and refinement (docs/cli.md#live)."""
    from ..agent.live import LiveError, resolve

    if opts.get("agent"):
        fail("give --agent URL or --vllm/--dcgm URL, not both")
    if opts.get("since"):
        fail("--since reads history (--agent or a FILE); --vllm/--dcgm sample from now: use --duration")
    targets = []
    for url in [*(opts.get("vllm") or ()), *([opts["dcgm"]] if opts.get("dcgm") else [])]:
        try:
            t = resolve(url)
        except LiveError as e:
            fail(str(e))
        if t.is_agent:
            fail(f"{url} is a fragscope agent: use --agent {t.base} (or diagnose {t.base})")
        targets.append(t)
    return _watch_targets(targets, fmt, fail_on, opts.get("duration"), opts.get("interval"), color, html)


class Together:
    """Several pages sampled as one round: up when any answered; the others' errors kept, and each
    page's scrapes counted (a page that failed most of them is a source down for the verdict)."""

    def __init__(self, collectors: list) -> None:
        self.collectors = collectors
        self.ok = [0] * len(collectors)
        self.failed = [0] * len(collectors)
        self.errors: list[str | None] = [None] * len(collectors)

    def collect(self, now: float):
        from ..model import CollectResult

        if len(self.collectors) == 1:
            r = self.collectors[0].collect(now)
            self._count(0, r)
            return r
        out = CollectResult()
        errs = []
        for i, c in enumerate(self.collectors):
            r = c.collect(now)
            self._count(i, r)
            out.samples.extend(r.samples)
            if not r.up:
                errs.append(r.error or f"{c.name}: down")
        out.up = bool(out.samples)
        out.error = "; ".join(errs) or None
        return out

    def _count(self, i: int, r) -> None:
        if r.up and r.samples:
            self.ok[i] += 1
        else:
            self.failed[i] += 1
            self.errors[i] = r.error or f"{self.collectors[i].name}: down"

    def never_answered(self) -> list[str]:
        """One line for each page that failed more than half of its scrapes (the verdict was judged
        mostly or wholly without it); a page that failed now and then is only counted in the notes."""
        out = []
        for i, c in enumerate(self.collectors):
            n = self.ok[i] + self.failed[i]
            if n and self.failed[i] * 2 > n:
                what = ("no scrape succeeded" if self.ok[i] == 0 else f"{self.failed[i]} of {n} scrapes failed")
                out.append(f"{c.name}: {what} (last: {self.errors[i] or 'no samples'})")
        return out


def sampling_plan(duration: str | None, interval: str | None) -> tuple[float, float]:
    """(duration, interval) in seconds of a live sampling from --duration / --interval (one-line errors)."""
    dur = parse_duration_flag(duration, "--duration", "2m")
    if dur > MAX_LIVE_DURATION_S:
        fail(f"--duration: at most 24h (got {duration}); for longer, run `fragscope agent`")
    # default: 5 s, or less for a short --duration (at least 10 scrapes)
    ivl = parse_duration_flag(interval, "--interval") if interval else max(MIN_INTERVAL_S, min(5.0, dur / 10))
    if ivl < MIN_INTERVAL_S:
        fail(f"--interval: at least {MIN_INTERVAL_S:g}s")
    if ivl > dur:
        fail("--interval is longer than --duration")
    return dur, ivl


def sample_targets(targets: list, dur: float, ivl: float, on_verdict=None, on_round=None):
    """Sample resolved live pages together (``agent.live.watch``): (window, report, progress)."""
    from ..agent.live import PageCollector, watch
    from ..pipeline import diagnose  # imported before sampling starts: Ctrl-C then always lands in watch()

    together = Together([PageCollector(t) for t in targets])
    window, report, prog = watch(together, dur, ivl, source="live: " + ", ".join(t.url for t in targets),
                                 judge=diagnose, on_verdict=on_verdict, on_round=on_round)
    if together.never_answered():  # a page judged without: the report's first line and exit 4
        report.signals["sources_down"] = together.never_answered()
    return window, report, prog


def _watch_targets(targets: list, fmt: str, fail_on: str, duration: str | None, interval: str | None,
                   color: bool | None, html: str | None) -> int:
    from ..agent.live import LiveError, finding_line, verdict_key
    from .render import print_report, report_exit_code

    dur, ivl = sampling_plan(duration, interval)
    import logging

    logging.getLogger("fragscope.collectors").setLevel(logging.ERROR)
    tty = sys.stderr.isatty()
    say = lambda msg: click.echo(msg, err=True)  # noqa: E731
    for t in targets:
        say(f"{t.url}: {t.describe()}")
    say(f"sampling every {ivl:g}s for {dur:g}s, a first verdict once 2 scrapes are in (Ctrl-C gives the "
        "final verdict at once)")
    shown: list[set] = []
    status_len = [0]

    def clear() -> None:
        if tty and status_len[0]:
            sys.stderr.write("\r\x1b[K")
            status_len[0] = 0

    def on_round(p) -> None:
        if not tty:
            if p.last_error and p.round > 1:
                say(f"  {_fmt_elapsed(p.elapsed_s)} scrape {p.round} failed: {p.last_error}"[:300])
            return
        rep = p.report
        verdict = ("no verdict yet" if rep is None else
                   ", ".join(f"{f.id} ({f.severity.value})" for f in rep.findings) or
                   (f"no finding, {len(rep.inconclusive)} inconclusive" if rep.inconclusive else "no finding"))
        line = (f"  {_fmt_elapsed(p.elapsed_s)}  {p.ok_rounds}/{p.round} scrapes  {verdict}"
                + (f"  last scrape failed: {p.last_error}" if p.last_error else "") + "  (Ctrl-C: final verdict)")
        width = max(40, __import__("shutil").get_terminal_size((100, 20)).columns - 1)
        sys.stderr.write("\r\x1b[K" + line[:width])
        sys.stderr.flush()
        status_len[0] = len(line)

    def on_verdict(rep, p, first: bool) -> None:
        clear()
        cur = verdict_key(rep)
        if first:
            say(f"first verdict after {p.ok_rounds} scrapes ({p.elapsed_s:.0f} s):")
            for f in rep.findings:
                say("  " + finding_line(f)[:400])
            if not rep.findings:
                say(f"  no finding yet ({len(rep.inconclusive)} detectors inconclusive; refining)")
        else:
            prev = shown[-1] if shown else set()
            for f in rep.findings:
                if (f.id, f.severity.value) not in prev:
                    say(f"  {_fmt_elapsed(p.elapsed_s)} new: " + finding_line(f)[:400])
            for fid, sev in sorted(prev - cur):
                say(f"  {_fmt_elapsed(p.elapsed_s)} cleared: {fid} ({sev})")
        shown.append(cur)

    try:
        window, report, prog = sample_targets(targets, dur, ivl, on_verdict=on_verdict, on_round=on_round)
    except LiveError as e:
        clear()
        fail(str(e))
    clear()
    say(f"final verdict after {prog.ok_rounds} scrapes ({prog.elapsed_s:.0f} s)"
        + (", stopped by Ctrl-C" if prog.interrupted else "") + ":")
    print_report(report, fmt, window=window, color=color, html=html)
    return report_exit_code(report, fail_on)


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    """Attach this module's commands to the two entry points."""
    fragscope_group.add_command(agent_cmd)
    fragscope_group.add_command(record_cmd)
