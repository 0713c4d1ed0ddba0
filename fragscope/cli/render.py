"""Terminal and JSON rendering of a Report (rich on a TTY, plain text otherwise)."""
from __future__ import annotations

import json
import math
import sys
from datetime import datetime, timezone


from ..model import Report, Severity, rank_findings

_SEV_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def fmt_ts(ts: float | None) -> str:
    if ts is None or not math.isfinite(ts):
        return "?"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_value(v: float | None, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if unit == "bytes":
        for u, s in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if abs(v) >= s:
                return f"{v / s:.2f} {u}"
        return f"{v:.0f} B"
    if unit == "ratio":
        return f"{v * 100:.1f} %"
    if unit == "seconds":
        if abs(v) < 1e-3:
            return f"{v * 1e6:.0f} µs"
        if abs(v) < 1:
            return f"{v * 1e3:.1f} ms"
        return f"{v:.2f} s"
    if unit == "hertz":
        return f"{v / 1e6:.0f} MHz"
    txt = f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return f"{txt} {unit}".strip()


def report_exit_code(report: Report, fail_on: str) -> int:
    if fail_on == "never":
        return 0
    limit = Severity(fail_on).rank
    return 1 if any(f.severity.rank >= limit for f in report.findings) else 0


def print_report(report: Report, fmt: str = "human", file=None) -> None:
    out = file or sys.stdout
    if fmt == "json":
        out.write(json.dumps(report.to_dict(), indent=2, default=_json_default) + "\n")
        return
    render_human(report, out)


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)


def _fmt_window(w) -> str:
    return f"{fmt_ts(w[0])} → {fmt_ts(w[1])}"


def render_human(report: Report, out) -> None:
    from rich.console import Console
    from rich.markup import escape

    tty = out is sys.stdout and out.isatty()
    console = Console(file=out, highlight=False, force_terminal=tty if tty else False,
                      width=None if tty else 120, soft_wrap=not tty)
    start, end = report.window
    console.print(f"[bold]fragscope[/] {escape(report.source or 'input')}  window {fmt_ts(start)} → {fmt_ts(end)}")
    findings = rank_findings(report.findings)
    if not findings:
        console.print("No finding." + (" Some detectors could not judge (below): this is not a clean bill of health."
                                       if report.inconclusive else ""))
    for i, f in enumerate(findings, 1):
        style = _SEV_STYLE.get(f.severity.value, "")
        subject = " ".join(f"{k}={v}" for k, v in f.subject.items())
        console.print(f"\n[{style}]{i}. {f.severity.value.upper()}[/] [bold]{f.id}[/]  confidence {f.confidence:.2f}"
                      f"{'  ' + escape(subject) if subject else ''}  onset {fmt_ts(f.onset)}")
        console.print("   " + escape(f.summary))
        common_win = None
        wins = [e.window for e in f.evidence if e.window]
        if wins:
            common_win = max(set(wins), key=wins.count)
            console.print(f"   evidence (recent {_fmt_window(common_win)}):", style="dim")
        for e in f.evidence:
            mark = "[green]+[/]" if e.agrees else "[red]-[/]"
            base = f" baseline {fmt_value(e.baseline, e.unit)}" if e.baseline is not None else ""
            thr = f" threshold {fmt_value(e.threshold, e.unit)}" if e.threshold is not None else ""
            win = f" [{_fmt_window(e.window)}]" if e.window and e.window != common_win else ""
            note = f" — {e.note}" if e.note else ""
            console.print(f"   {mark} " + escape(f"{e.signal}: {fmt_value(e.observed, e.unit)}{base}{thr}{win}{note}"))
        if f.missing:
            console.print("   missing to be sure: " + escape(", ".join(f.missing)), style="dim")
        if f.playbook:
            pb = f.playbook
            for a in (pb.get("actions") or [])[:4]:
                console.print("   [bold]fix:[/] " + escape(a))
            if not pb.get("actions") and pb.get("immediate"):
                console.print("   [bold]now:[/] " + escape(pb["immediate"][0]))
            console.print(f"   playbook, preconditions and verification: diagnose explain {f.id}", style="dim")
        for att in f.attachments:
            console.print("   attached: " + escape(f"{att.get('kind', 'evidence')}: {att.get('verdict') or ''} "
                                                   f"{att.get('summary') or ''}".strip()))
    if report.inconclusive:
        console.print("\n[bold]Could not judge[/] (not healthy, just not enough data):")
        for inc in report.inconclusive:
            miss = ", ".join(inc.missing) if inc.missing else ""
            console.print("   " + escape(f"{inc.id}: {inc.reason}{' — missing ' + miss if miss else ''}"))
    notes = (report.signals or {}).get("notes") or []
    for n in notes:
        console.print("note: " + escape(str(n)), style="dim")
