"""Reports people look at: one self-contained HTML page per diagnosis (docs/report.md).

Pure functions: findings and data in, an HTML string out (no I/O, no clock unless none is given).

The names below are imported on first use, so that a command that only formats numbers
(``fragscope.report.fmt``) does not load the HTML renderers.
"""
from __future__ import annotations

import importlib

_FROM = {"agent_page": ".agent_page", "CSP": ".html", "copy_snippets": ".html", "render_html": ".html",
         "render_snapshot_html": ".html", "render_trace_html": ".html"}

__all__ = ["agent_page", "CSP", "copy_snippets", "render_html", "render_snapshot_html", "render_trace_html"]


def __getattr__(name: str):
    where = _FROM.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # after the import, which binds the submodule of the same name here
    return value
