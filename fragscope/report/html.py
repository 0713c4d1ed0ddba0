"""The HTML report of a metrics window (a recording, a live server, the agent's recent window): pure
functions from findings and data to ONE self-contained HTML string.

The page's frame and CSP are in page.py, the findings in sections.py (playbooks: playbook_html.py),
the charts in svg.py; the trace and snapshot pages in trace_html.py and snapshot_html.py. The names
``fragscope.report`` re-exports are importable from here too.
"""
from __future__ import annotations

from ..model import Report, Window
from .page import CSP, header, page, panel
from .playbook_html import copy_snippets
from .sections import findings_section, summary_table
from .snapshot_html import render_snapshot_html
from .svg import esc
from .trace_html import render_trace_html

def render_html(report: Report, window: Window | None = None, *, title: str | None = None,
                generated_at: float | None = None, banner: str = "", judged: bool = True,
                before: str = "") -> str:
    """The report of a recording, a live window or the agent's recent window, as one HTML page.

    ``window`` gives the timeline and panels (drawn from detectors.frame.build_frame); without it
    the page has the findings only and says so. ``judged=False``: the detectors have not run yet
    (the agent's first minutes), so no "No finding." either. ``before``: HTML (escaped by the caller)
    placed under the header, before the findings (the agent's collector summary)."""
    from .series import frame_of, panels

    d = report.to_dict()
    findings = d["findings"]
    w = d["window"]
    body = [header(title or "diagnosis", report.source or (window.source if window else ""),
                    (w["start"], w["end"]), generated_at=generated_at)]
    down = (d.get("signals") or {}).get("sources_down")
    if isinstance(down, list) and down:  # never read as healthy: first thing under the header (docs/cli.md)
        body.append('<p class="sources-down"><b>Sources down: this verdict is incomplete.</b> '
                    + " · ".join(esc(x) for x in down) + "</p>")
    if banner:
        body.append(f"<p><b>{esc(banner)}</b></p>")
    if before:
        body.append(before)
    body.append(summary_table(findings))
    frame = frame_of(window)
    body.append("<h2>Timeline</h2>")
    if frame is None:
        body.append('<p class="absent">No time series to draw (an empty window).</p>')
    else:
        charts, absent = panels(frame, findings)
        t0, t1 = frame.start, frame.end
        if t1 <= t0:
            t1 = t0 + max(frame.step, 1.0)
        for c in charts:
            body.append(panel(c, t0, t1))
        if absent:
            body.append('<div class="absent"><b>Not drawn</b> (absent, not zero):<ul>'
                        + "".join(f"<li>{esc(a)}</li>" for a in absent) + "</ul></div>")
        if not charts:
            body.append('<p class="absent">None of the report\'s signals are in this window.</p>')
    body += findings_section(findings, d["inconclusive"], list((d.get("signals") or {}).get("notes") or []),
                              judged)
    return page(f"fragscope{' ' + title if title else ''}: {report.source or 'diagnosis'}", body)


__all__ = ["render_html", "render_trace_html", "render_snapshot_html", "copy_snippets", "CSP"]
