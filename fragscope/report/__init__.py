"""Reports people look at: one self-contained HTML page per diagnosis (docs/report.md).

Pure functions: findings and data in, an HTML string out (no I/O, no clock unless none is given).
"""
from __future__ import annotations

from .agent_page import agent_page
from .html import CSP, copy_snippets, render_html, render_snapshot_html, render_trace_html

__all__ = ["agent_page", "CSP", "copy_snippets", "render_html", "render_snapshot_html", "render_trace_html"]
