"""The page around every HTML report: the strict Content-Security-Policy, the one stylesheet, the
header, and the time-series panels with their legends.

No script, no external resource: the page carries ``Content-Security-Policy: default-src 'none';
style-src 'unsafe-inline'`` so a browser refuses any network access or script even if some text were
not escaped. Every piece of text from the input goes through ``esc``. Charts: svg.py (why SVG: see there).
"""
from __future__ import annotations

import time

from .. import __version__
from .fmt import fmt_ts
from .svg import Chart, esc, time_chart

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

_CSS = """
:root{--fg:#1d2329;--mut:#5d6b78;--bd:#d8dee4;--bg:#fff;--crit:#b71c1c;--warn:#b26a00;--info:#01579b}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
 background:var(--bg);margin:0 auto;max-width:1100px;padding:16px 20px 40px}
h1{font-size:20px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid var(--bd);padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}.meta{color:var(--mut);font-size:13px}
table{border-collapse:collapse;width:100%;margin:6px 0 10px;font-size:13px}
th,td{border-bottom:1px solid var(--bd);padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f4f6f8;font-weight:600}td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
.sev{display:inline-block;padding:1px 7px;border-radius:3px;color:#fff;font-weight:600;font-size:12px}
.sev-critical{background:var(--crit)}.sev-warning{background:var(--warn)}.sev-info{background:var(--info)}
.finding{border:1px solid var(--bd);border-left:5px solid var(--mut);border-radius:4px;padding:8px 14px;margin:14px 0}
.finding.critical{border-left-color:var(--crit)}
.finding.warning{border-left-color:var(--warn)}.finding.info{border-left-color:var(--info)}
.agree{color:#1b7f3b;font-weight:700}.against{color:var(--crit);font-weight:700}
code.cmd{display:inline-block;background:#f4f6f8;border:1px solid var(--bd);border-radius:3px;padding:1px 6px;
 font:12.5px/1.5 ui-monospace,"DejaVu Sans Mono",monospace;user-select:all;-webkit-user-select:all;cursor:copy}
ul{margin:4px 0 8px;padding-left:22px}li{margin:2px 0}.small{font-size:12px;color:var(--mut)}
.panel{margin:8px 0 16px}.panel h3{margin:4px 0 2px}
.legend{font-size:12.5px;color:var(--fg);margin:0 0 2px}.legend span{margin-right:14px;white-space:nowrap}
.sw{display:inline-block;width:18px;height:0;border-top:3px solid;vertical-align:middle;margin-right:5px}
.sw.dash{border-top-style:dashed}.sw.box{height:10px;border:0;width:12px}
svg.chart{width:100%;height:auto;display:block}
svg .plot{fill:#fbfcfd;stroke:#c9d1d9}svg .grid{stroke:#e6eaee;stroke-width:1}
svg .tick{font:12px system-ui,"DejaVu Sans",sans-serif;fill:#44505c}
svg .mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace}
svg .marklabel{font:600 12px system-ui,"DejaVu Sans",sans-serif}
svg .inbar{font:600 11.5px system-ui,sans-serif;fill:#fff}
details{margin:4px 0}summary{cursor:pointer;color:var(--mut)}
.absent{color:var(--mut);font-size:13px}
.sources-down{color:var(--crit);font-size:14px}.collectors{font-size:13px}.collectors .up{color:#1b5e20}.collectors .down{color:var(--crit)}.collectors .pending{color:var(--mut)}
"""


def page(title: str, body: list[str]) -> str:
    """One self-contained HTML document: ``body`` pieces (HTML) under the CSP and the stylesheet."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<meta name=\"generator\" content=\"fragscope {esc(__version__)}\">"
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")

def header(kind: str, source: str, window: tuple[float | None, float | None] | None, extra: str = "",
            generated_at: float | None = None) -> str:
    """``extra`` is HTML (callers escape what goes into it)."""
    gen = generated_at if generated_at is not None else time.time()
    meta = []
    if window and window[0] is not None and window[1] is not None:
        meta.append(f"window {esc(fmt_ts(window[0]))} → {esc(fmt_ts(window[1]))}")
    if extra:
        meta.append(extra)
    meta.append(f"generated {esc(fmt_ts(gen))} by fragscope {esc(__version__)} · times in UTC")
    return (f"<header><h1>fragscope {esc(kind)}: {esc(source or 'input')}</h1>"
            f"<div class=\"meta\">{' · '.join(meta)}</div></header>")

def legend(chart: Chart) -> str:
    """The key of a time chart: its lines, its band, and the kinds of marks it draws."""
    parts = []
    for ln in chart.lines:
        cls = "sw dash" if ln.dashed else "sw"
        parts.append(f'<span><i class="{cls}" style="border-top-color:{esc(ln.colour)}"></i>{esc(ln.label)}</span>')
    if chart.bands:
        parts.append(f'<span><i class="sw box" style="background:#f5b7b1"></i>{esc(chart.band_label)}</span>')
    if any(m.label.startswith("onset") for m in chart.marks):
        parts.append('<span><i class="sw dash" style="border-top-color:#c0392b"></i>onset of a finding</span>')
    if any(m.label.startswith("threshold crossed") for m in chart.marks):
        parts.append('<span><i class="sw dash" style="border-top-color:#7b1fa2"></i>threshold crossed</span>')
    if any(m.label == "restart" for m in chart.marks):
        parts.append('<span><i class="sw dash" style="border-top-color:#7f7f7f"></i>engine restart</span>')
    return f'<div class="legend">{"".join(parts)}</div>'

def panel(chart: Chart, t0: float, t1: float) -> str:
    """One titled time-series panel over [t0, t1] with its legend."""
    return (f'<section class="panel"><h3>{esc(chart.title)}</h3>{legend(chart)}'
            f"{time_chart(chart, t0, t1)}</section>")
