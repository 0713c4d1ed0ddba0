"""The agent's page at ``/``: the same report as ``diagnose --html``, for the agent's recent window,
under a one-line summary of which collectors are up."""
from __future__ import annotations

import dataclasses
import math
import socket
from typing import Any, Iterable, Mapping

from ..model import Report, Window
from .fmt import fmt_ts
from .html import render_html
from .svg import esc


def _span(window: Window | None) -> str:
    if window is None or not (math.isfinite(window.start) and math.isfinite(window.end)):
        return "recent window"
    s = max(0.0, window.end - window.start)
    for unit, n in (("h", 3600.0), ("min", 60.0)):
        if s >= n:
            return f"last {f'{s / n:.1f}'.removesuffix('.0')} {unit}"
    return f"last {s:.0f} s"


def collectors_summary(collectors: Iterable[Mapping[str, Any]], ready_reasons: list[str] | None = None) -> str:
    """One line of HTML: how many collectors are up, each by name (a down one with since when and why,
    its error in a tooltip), and whether the agent is ready. ``collectors``: /api/v1/status's records."""
    cols = [c for c in collectors if isinstance(c, Mapping)]
    if not cols:
        return '<p class="collectors"><b>Collectors:</b> none configured.</p>'
    up = [c for c in cols if c.get("up") is True]
    parts = []
    for c in cols:
        name = esc(c.get("name"))
        if c.get("up") is True:
            parts.append(f'<span class="up">{name} up</span>')
        elif c.get("up") is False:
            since = c.get("down_since")
            when = f" since {esc(fmt_ts(since))}" if isinstance(since, (int, float)) else ""
            err = str(c.get("error") or "down")
            parts.append(f'<span class="down" title="{esc(err)}">{name} down{when}: {esc(err[:120])}</span>')
        else:
            parts.append(f'<span class="pending">{name} not run yet</span>')
    head = f"Collectors {len(up)} of {len(cols)} up"
    ready = ("" if ready_reasons is None else
             " · <b>ready</b>" if not ready_reasons else
             f' · <b class="down">not ready</b>: {esc("; ".join(ready_reasons)[:300])}')
    return f'<p class="collectors"><b>{head}:</b> {" · ".join(parts)}{ready}</p>'


def agent_page(report: Report | None, report_at: float | None, window: Window | None, now: float,
               collectors: Iterable[Mapping[str, Any]] | None = None, ready_reasons: list[str] | None = None,
               host: str | None = None) -> str:
    """``report``: the agent's last report (None before the detectors first ran); ``window``: the
    recent window the detectors read (the agent's in-memory ring); ``collectors``: the records of
    /api/v1/status (name, up, error, down_since); ``host``: the page's subject (default: this host's
    name, the pod's name in Kubernetes). Title: ``fragscope agent: <host> (last 3 h)``."""
    subject = f"{host or socket.gethostname()} ({_span(window)})"
    before = collectors_summary(collectors, ready_reasons) if collectors is not None else ""
    if report is None:
        start = window.start if window is not None else math.nan
        end = window.end if window is not None else math.nan
        rep = Report(window=(start, end), source=subject)
        banner = "The detectors have not run yet: the charts show what was collected so far; no judgement yet."
        return render_html(rep, window, title="agent", generated_at=now, banner=banner, judged=False,
                           before=before)
    age = now - report_at if report_at is not None else None
    banner = (f"Last diagnosis {fmt_ts(report_at)} ({age:.0f} s ago); read-only page, reload for a newer one."
              if age is not None else "")
    return render_html(dataclasses.replace(report, source=subject), window, title="agent", generated_at=now,
                       banner=banner, before=before)
