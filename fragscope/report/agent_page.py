"""The agent's page at ``/``: the same report as ``diagnose --html``, for the agent's recent window."""
from __future__ import annotations

import math

from ..model import Report, Window
from .fmt import fmt_ts
from .html import render_html


def agent_page(report: Report | None, report_at: float | None, window: Window | None, now: float) -> str:
    """``report``: the agent's last report (None before the detectors first ran); ``window``: the
    recent window the detectors read (the agent's in-memory ring)."""
    if report is None:
        start = window.start if window is not None else math.nan
        end = window.end if window is not None else math.nan
        rep = Report(window=(start, end), source=window.source if window is not None else "fragscope agent")
        banner = "The detectors have not run yet: the charts show what was collected so far; no judgement yet."
        return render_html(rep, window, title="agent", generated_at=now, banner=banner, judged=False)
    age = now - report_at if report_at is not None else None
    banner = (f"Last diagnosis {fmt_ts(report_at)} ({age:.0f} s ago); read-only page, reload for a newer one."
              if age is not None else "")
    return render_html(report, window, title="agent", generated_at=now, banner=banner)
