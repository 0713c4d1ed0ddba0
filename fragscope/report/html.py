"""The HTML report: pure functions from findings and data to ONE self-contained HTML string.

No script, no external resource: the page carries ``Content-Security-Policy: default-src 'none';
style-src 'unsafe-inline'`` so a browser refuses any network access or script even if some text were
not escaped. Every piece of text from the input (sources, labels, summaries, notes, playbooks) goes
through ``esc``. Commands are in ``<code class="cmd">`` with ``user-select: all``: one click selects
the whole command for copying, without script. Charts: svg.py (why SVG: see there).
"""
from __future__ import annotations

import re
import time

from .. import __version__
from ..model import Report, Window
from .fmt import fmt_clock, fmt_ts, fmt_value
from .svg import PALETTE, Chart, bar_chart, esc, segment_map, share_bars, time_chart

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
"""


# ---------------------------------------------------------------------------------------------
# Commands ready to copy, taken from a playbook action's text
_ENV_RE = re.compile(r"\b(PYTORCH_(?:CUDA_)?ALLOC_CONF=[A-Za-z0-9_:.,]+[A-Za-z0-9_])")
_NUM = r"[0-9]+(?:\.[0-9]+)?"
_FLAG_TO_RE = re.compile(rf"(--[a-z][a-z0-9-]+) ({_NUM}) → ({_NUM})(?![0-9.]* ?[A-Za-z])")
_FLAG_RE = re.compile(r"(--[a-z][a-z0-9-]+) ([0-9][0-9.]*[0-9]|[0-9])(?![0-9.]* ?(?:→|[A-Za-z%]))")
_CMD_RE = re.compile(r"\(((?:nvidia-smi|fragscope|diagnose|nsys|kubectl) [^()]+?)\)")


def copy_snippets(text: str) -> list[str]:
    """Shell-ready pieces of an action: ``export PYTORCH_CUDA_ALLOC_CONF=...``, an engine flag with
    its new value (``--gpu-memory-utilization 0.85``; for ``--x 0.90 → 0.93`` the target), or a command
    the text names in parentheses (``nvidia-smi -q -d POWER``)."""
    out: list[str] = []
    for m in _ENV_RE.finditer(text):
        out.append(f"export {m.group(1)}")
    for m in _FLAG_TO_RE.finditer(text):
        out.append(f"{m.group(1)} {m.group(3)}")
    for m in _FLAG_RE.finditer(text):
        if any(s.startswith(m.group(1) + " ") for s in out):
            continue
        out.append(f"{m.group(1)} {m.group(2)}")
    for m in _CMD_RE.finditer(text):
        out.append(m.group(1).strip())
    seen: set[str] = set()
    return [s for s in out if not (s in seen or seen.add(s))]


def dedupe(items) -> list:
    seen: set = set()
    out = []
    for x in items or []:
        k = x if isinstance(x, str) else repr(x)
        if k in seen:
            continue
        seen.add(k)
        out.append(x)
    return out


# ---------------------------------------------------------------------------------------------
def _page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<meta name=\"generator\" content=\"fragscope {esc(__version__)}\">"
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _header(kind: str, source: str, window: tuple[float | None, float | None] | None, extra: str = "",
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


def _legend(chart: Chart) -> str:
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


def _panel(chart: Chart, t0: float, t1: float) -> str:
    return (f'<section class="panel"><h3>{esc(chart.title)}</h3>{_legend(chart)}'
            f"{time_chart(chart, t0, t1)}</section>")


def _subject(d: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in (d or {}).items())


def _summary_table(findings: list[dict]) -> str:
    if not findings:
        return ""
    rows = []
    for i, f in enumerate(findings, 1):
        sev = str(f.get("severity", ""))
        rows.append(f'<tr><td class="num">{i}</td><td><span class="sev sev-{esc(sev)}">{esc(sev.upper())}</span></td>'
                    f'<td><a href="#finding-{i}">{esc(f.get("id"))}</a></td>'
                    f'<td class="num">{_conf(f.get("confidence"))}</td><td>{esc(_subject(f.get("subject")))}</td>'
                    f'<td>{esc(fmt_ts(f.get("onset")))}</td></tr>')
    return ("<table class=\"ranked\"><thead><tr><th>#</th><th>severity</th><th>diagnosis</th><th>confidence</th>"
            "<th>subject</th><th>onset</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _conf(c) -> str:
    try:
        return f"{float(c):.2f}"
    except (TypeError, ValueError):
        return "?"


def _evidence_table(evidence: list[dict]) -> str:
    """One row per evidence; the baseline / threshold / window columns only when some row has one."""
    if not evidence:
        return ""
    cols = [("baseline", "baseline"), ("threshold", "threshold"), ("window", "window (UTC)")]
    cols = [(k, h) for k, h in cols if any(e.get(k) is not None for e in evidence)]
    rows = []
    for e in evidence:
        unit = e.get("unit") or ""
        mark = '<span class="agree" title="agrees">+</span>' if e.get("agrees", True) else \
            '<span class="against" title="speaks against">−</span>'
        cells = []
        for k, _ in cols:
            v = e.get(k)
            if k == "window":
                txt = ""
                if isinstance(v, dict) and v.get("start") is not None and v.get("end") is not None:
                    txt = f"{fmt_clock(v['start'])}–{fmt_clock(v['end'])}"
            else:
                txt = fmt_value(v, unit) if v is not None else ""
            cells.append(f'<td class="num">{esc(txt)}</td>')
        rows.append(f"<tr><td>{mark}</td><td>{esc(e.get('signal'))}</td>"
                    f"<td class=\"num\">{esc(fmt_value(e.get('observed'), unit))}</td>{''.join(cells)}"
                    f"<td>{esc(e.get('note') or '')}</td></tr>")
    head = "".join(f"<th>{esc(h)}</th>" for _, h in cols)
    return ("<table class=\"evidence\"><thead><tr><th title=\"+ agrees with the diagnosis, − checked and speaks "
            f"against it\">±</th><th>signal</th><th>observed</th>{head}<th>note</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _text_with_cmds(text: str) -> str:
    snips = copy_snippets(text)
    extra = "".join(f' <code class="cmd">{esc(s)}</code>' for s in snips)
    return f"{esc(text)}{('<br>' + extra) if extra else ''}"


def _playbook(f: dict) -> str:
    pb = f.get("playbook") or {}
    if not isinstance(pb, dict) or not pb:
        return ""
    out = []
    title = pb.get("title")
    if title:
        out.append(f"<h3>Playbook: {esc(title)}</h3>")
    if pb.get("meaning"):
        out.append(f"<p>{esc(pb['meaning'])}</p>")
    immediate = dedupe(pb.get("immediate"))
    if immediate:
        out.append("<p><b>Now</b></p><ul>" + "".join(f"<li>{_text_with_cmds(x)}</li>" for x in immediate) + "</ul>")
    opts = pb.get("options") or []
    actions = dedupe(pb.get("actions"))
    if opts:  # the allocator settings are listed with their options below
        actions = [a for a in actions if not str(a).startswith("set PYTORCH_CUDA_ALLOC_CONF=")]
    if actions:
        out.append("<p><b>Fix (values computed from this incident)</b></p><ul>"
                   + "".join(f"<li>{_text_with_cmds(a)}</li>" for a in actions) + "</ul>")
    if opts:  # snapshot playbooks: allocator settings, each judged
        items = []
        for o in opts:
            verb = {True: "apply", False: "skip", None: "maybe"}.get(o.get("applies"), "maybe")
            cond = "".join(f"<li>needs: {esc(c)}</li>" for c in o.get("preconditions") or [])
            cond += "".join(f"<li>not if: {esc(c)}</li>" for c in o.get("contraindications") or [])
            items.append(f"<li><b>{esc(verb)}</b> <code class=\"cmd\">export PYTORCH_CUDA_ALLOC_CONF="
                         f"{esc(o.get('setting'))}</code> [{esc(o.get('status', ''))}]: {esc(o.get('why', ''))}"
                         f"{('<ul>' + cond + '</ul>') if cond else ''}</li>")
        out.append("<p><b>Allocator settings</b></p><ul>" + "".join(items) + "</ul>")
    durable = pb.get("durable") or []
    if durable:
        items = []
        for a in durable:
            if isinstance(a, dict):
                cond = "".join(f"<li>when: {esc(c)}</li>" for c in a.get("preconditions") or [])
                cond += "".join(f"<li>not when: {esc(c)}</li>" for c in a.get("contraindications") or [])
                sub = f"<ul>{cond}</ul>" if cond else ""
                items.append(f"<li>{_text_with_cmds(str(a.get('text', '')))}{sub}</li>")
            else:
                items.append(f"<li>{_text_with_cmds(str(a))}</li>")
        out.append("<details><summary>Durable fixes with their preconditions and contraindications</summary><ul>"
                   + "".join(items) + "</ul></details>")
    verify = dedupe(pb.get("verify"))
    if verify:
        out.append("<details><summary>How to verify it worked</summary><ul>"
                   + "".join(f"<li>{esc(v)}</li>" for v in verify) + "</ul></details>")
    refs = pb.get("references") or []
    if refs:
        out.append("<details><summary>References</summary><ul>" + "".join(f"<li>{esc(r)}</li>" for r in refs)
                   + "</ul></details>")
    fid = f.get("id")
    if fid:
        out.append(f'<p class="small">In a terminal: <code class="cmd">diagnose explain {esc(fid)}</code></p>')
    return "".join(out)


_BASIS = {"change": "a change against the window's baseline", "level": "judged on the present level",
          "snapshot": "from a memory snapshot", "trace": "from a kernel trace", "log": "from engine logs"}


def _finding(i: int, f: dict) -> str:
    sev = str(f.get("severity", "info"))
    subj = _subject(f.get("subject"))
    head = (f'<span class="sev sev-{esc(sev)}">{esc(sev.upper())}</span> <b>{esc(f.get("id"))}</b> · confidence '
            f'{_conf(f.get("confidence"))}{(" · " + esc(subj)) if subj else ""} · '
            f'onset {esc(fmt_ts(f.get("onset")))}')
    basis = _BASIS.get(str(f.get("basis")))
    if basis:
        head += f' · <span class="small">{esc(basis)}</span>'
    parts = [f'<article class="finding {esc(sev)}" id="finding-{i}"><h3>{i}. {head}</h3>',
             f"<p>{esc(f.get('summary', ''))}</p>", _evidence_table(f.get("evidence") or [])]
    if f.get("missing"):
        parts.append(f"<p class=\"small\">Missing to be sure: {esc(', '.join(map(str, f['missing'])))}</p>")
    for att in f.get("attachments") or []:
        if isinstance(att, dict):
            parts.append(f"<p class=\"small\">Attached {esc(att.get('kind', 'evidence'))}: "
                         f"{esc(att.get('verdict') or '')} {esc(att.get('summary') or '')}</p>")
    parts.append(_playbook(f))
    parts.append("</article>")
    return "".join(parts)


def _findings_section(findings: list[dict], inconclusive: list[dict], notes: list[str],
                      judged: bool = True) -> list[str]:
    out = ["<h2>Findings</h2>"]
    if not judged:
        out.append("<p><b>Not judged yet.</b> The detectors have not run on this window.</p>")
    elif not findings:
        out.append("<p><b>No finding.</b>" + (" Some detectors could not judge (below): this is not a clean bill of "
                                              "health.</p>" if inconclusive else "</p>"))
    else:
        out.append('<p class="small">In evidence tables <span class="agree">+</span> marks a signal that agrees '
                   'with the diagnosis and <span class="against">−</span> one that was checked and speaks against '
                   'it.</p>')
    out += [_finding(i, f) for i, f in enumerate(findings, 1)]
    if inconclusive:
        out.append("<h2>Could not judge</h2><p class=\"small\">Not healthy, just not enough data.</p><table>"
                   "<thead><tr><th>diagnosis</th><th>reason</th><th>missing</th></tr></thead><tbody>")
        for inc in inconclusive:
            out.append(f"<tr><td>{esc(inc.get('id'))}</td><td>{esc(inc.get('reason', ''))}</td>"
                       f"<td>{esc(', '.join(map(str, inc.get('missing') or [])))}</td></tr>")
        out.append("</tbody></table>")
    if notes:
        out.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    return out


# ---------------------------------------------------------------------------------------------
def render_html(report: Report, window: Window | None = None, *, title: str | None = None,
                generated_at: float | None = None, banner: str = "", judged: bool = True) -> str:
    """The report of a recording, a live window or the agent's recent window, as one HTML page.

    ``window`` gives the timeline and panels (drawn from detectors.frame.build_frame); without it
    the page has the findings only and says so. ``judged=False``: the detectors have not run yet
    (the agent's first minutes), so no "No finding." either."""
    from .series import frame_of, panels

    d = report.to_dict()
    findings = d["findings"]
    w = d["window"]
    body = [_header(title or "diagnosis", report.source or (window.source if window else ""),
                    (w["start"], w["end"]), generated_at=generated_at)]
    if banner:
        body.append(f"<p><b>{esc(banner)}</b></p>")
    body.append(_summary_table(findings))
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
            body.append(_panel(c, t0, t1))
        if absent:
            body.append('<div class="absent"><b>Not drawn</b> (absent, not zero):<ul>'
                        + "".join(f"<li>{esc(a)}</li>" for a in absent) + "</ul></div>")
        if not charts:
            body.append('<p class="absent">None of the report\'s signals are in this window.</p>')
    body += _findings_section(findings, d["inconclusive"], list((d.get("signals") or {}).get("notes") or []),
                              judged)
    return _page(f"fragscope: {report.source or 'diagnosis'}", body)


def render_trace_html(analysis: dict, report: Report, *, generated_at: float | None = None) -> str:
    """A kernel-timeline analysis (detectors.timeline): busy/idle share per device and stream, the
    kernel-gap distribution, the host side, and the findings."""
    a = analysis
    w = a.get("window") or {}
    sel = a.get("selection") or {}
    extra = (f"{esc(a.get('format', ''))} · span {esc(fmt_value(w.get('span_seconds'), 'seconds'))} · "
             f"{esc(sel.get('ops_analysed', '?'))} of {esc(sel.get('ops_total', '?'))} GPU ops analysed")
    body = [_header("trace", a.get("source", ""), (w.get("start"), w.get("end")), extra, generated_at)]
    findings = report.to_dict()["findings"]
    body.append(_summary_table(findings))
    if sel.get("rule"):
        body.append(f'<p class="small">Selection: {esc(sel["rule"])}</p>')
    devices = a.get("devices") or []
    body.append("<h2>Busy / idle share</h2>")
    if devices:
        rows = []
        for d in devices:
            rows.append((f"GPU {d.get('device')} (all)", _share_parts(d)))
            for s in (d.get("streams") or [])[:8]:
                rows.append((f"  stream {s.get('stream')}", _share_parts(s)))
        body.append('<div class="legend"><span><i class="sw box" style="background:#009E73"></i>busy</span>'
                    '<span><i class="sw box" style="background:#D55E00"></i>idle: waiting on the host (launch)</span>'
                    '<span><i class="sw box" style="background:#E69F00"></i>idle: waiting on a kernel</span>'
                    '<span><i class="sw box" style="background:#9aa5b1"></i>idle: other</span></div>')
        body.append(share_bars(rows, "Busy / idle share of the analysed span", chart_id="chart-busy-idle"))
        more = sum(max(0, len(d.get("streams") or []) - 8) for d in devices)
        if more:
            body.append(f'<p class="small">{more} more streams in the JSON output.</p>')
        body.append("<h2>Kernel gaps</h2>")
        for d in devices:
            body.append(_gap_chart(d))
        body.append(_device_table(devices))
    else:
        body.append('<p class="absent">No GPU operations in this trace.</p>')
    h = a.get("host") or {}
    if h:
        body.append("<h2>Host side</h2><table style=\"width:auto\"><tbody>" + "".join(
            f"<tr><th>{esc(k)}</th><td>{esc(_host_val(k, v))}</td></tr>" for k, v in h.items()
            if not isinstance(v, (dict, list))) + "</tbody></table>")
    d = report.to_dict()
    body += _findings_section(findings, d["inconclusive"], list(a.get("notes") or []))
    return _page(f"fragscope trace: {a.get('source', '')}", body)


def _host_val(k: str, v) -> str:
    if v is None:
        return "n/a"
    if k.endswith("_bytes"):
        return fmt_value(float(v), "bytes")
    if isinstance(v, float):
        return fmt_value(v, "ratio" if k.endswith("_ratio") else "seconds" if k.endswith("_seconds") else "")
    return str(v)


def _share_parts(m: dict) -> list[tuple[str, float, str]]:
    busy = m.get("busy_ratio")
    idle = m.get("idle_ratio")
    parts = [("busy", busy, "#009E73")]
    if idle is not None:
        hw, kw, ow = (m.get("host_wait_ratio"), m.get("kernel_wait_ratio"), m.get("other_wait_ratio"))
        if hw is None and kw is None and ow is None:
            parts.append(("idle", idle, "#9aa5b1"))
        else:
            parts += [("idle: waiting on the host", idle * (hw or 0.0), "#D55E00"),
                      ("idle: waiting on a kernel", idle * (kw or 0.0), "#E69F00"),
                      ("idle: other", idle * (ow or 0.0), "#9aa5b1")]
    return [(p, f, c) for p, f, c in parts if f is not None]


def _gap_chart(d: dict) -> str:
    dev = d.get("device")
    hist = d.get("gap_histogram")
    if isinstance(hist, dict) and hist.get("edges_seconds") and hist.get("counts"):
        edges, counts = hist["edges_seconds"], hist["counts"]
        labels = [f"≤{fmt_value(e, 'seconds')}" for e in edges[1:len(counts) + 1]]
        title = f"GPU {dev}: kernel gap histogram (gaps per bin)"
        return (f'<section class="panel"><h3>{esc(title)}</h3>'
                f'{bar_chart(labels, [float(c) for c in counts], "", title, chart_id=f"chart-gaps-gpu{dev}")}'
                "</section>")
    g = d.get("gap_seconds") or {}
    keys = [k for k in ("p50", "p90", "p99", "max") if k in g]
    if not keys:
        return f'<p class="absent">GPU {esc(dev)}: no gaps (fewer than two operations).</p>'
    title = f"GPU {dev}: kernel gap distribution (quantiles, log scale)"
    chart = bar_chart(keys, [g.get(k) for k in keys], "seconds", title, log=True, colour=PALETTE[0],
                      chart_id=f"chart-gaps-gpu{dev}")
    return (f'<section class="panel"><h3>{esc(title)}</h3><p class="small">The analysis keeps gap quantiles, '
            f'not every gap: bars are p50 / p90 / p99 / max of the gaps between consecutive GPU operations.</p>'
            f"{chart}</section>")


def _device_table(devices: list[dict]) -> str:
    rows = []
    for d in devices:
        g = d.get("gap_seconds") or {}
        ld = d.get("launch_delay_seconds") or {}
        ops = sum((d.get("ops") or {}).values())
        rows.append(f"<tr><td>{esc(d.get('device'))}</td><td class=\"num\">{esc(ops)}</td>"
                    f"<td class=\"num\">{esc(fmt_value(d.get('busy_ratio'), 'ratio'))}</td>"
                    f"<td class=\"num\">{esc(fmt_value(d.get('idle_ratio'), 'ratio'))}</td>"
                    + "".join(f"<td class=\"num\">{esc(fmt_value(g.get(k), 'seconds'))}</td>"
                              for k in ("p50", "p99", "max"))
                    + f"<td class=\"num\">{esc(fmt_value(ld.get('p50'), 'seconds'))}</td>"
                    f"<td class=\"num\">{esc(fmt_value(d.get('short_kernel_ratio'), 'ratio'))}</td></tr>")
    return ("<table><thead><tr><th>GPU</th><th>ops</th><th>busy</th><th>idle</th><th>gap p50</th><th>gap p99</th>"
            "<th>gap max</th><th>launch delay p50</th><th>short kernels</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def render_snapshot_html(doc: dict, map_rows: list[dict], segments_in_scope: int, *,
                         generated_at: float | None = None) -> str:
    """A memory-snapshot analysis (fragscope.playbooks.snapshot.diagnose_snapshot) with its per-segment map
    (``map_rows`` from segment_map_rows)."""
    f = doc.get("format") or {}
    extra = (f"{esc(f.get('container', ''))}, {esc(f.get('layout', ''))} · {esc(doc.get('segment_count'))} segments, "
             f"{esc(doc.get('block_count'))} blocks · verdict <b>{esc(doc.get('verdict'))}</b>")
    body = [_header("memory snapshot", doc.get("source", ""), None, extra, generated_at)]
    findings = [x for x in rank_findings_dicts(doc.get("findings") or [])]
    body.append(_summary_table(findings))
    s = doc.get("allocator_settings") or {}
    if s.get("known"):
        body.append(f"<p>Allocator: backend {esc(s.get('backend') or '?')}, expandable_segments "
                    f"{esc({True: 'on', False: 'off'}.get(s.get('expandable_segments'), '?'))}, "
                    f"PYTORCH_CUDA_ALLOC_CONF=<code>{esc(repr(s.get('alloc_conf')))}</code></p>")
    else:
        body.append('<p class="small">Allocator settings: not recorded in this snapshot (older PyTorch).</p>')
    devs = doc.get("devices") or []
    if devs:
        body.append("<h2>Devices</h2><table><thead><tr><th>GPU</th><th>verdict</th><th>reserved</th><th>allocated</th>"
                    "<th>free in segments</th><th>largest free</th><th>external fragmentation</th>"
                    "<th>empty_cache() returns</th><th>stuck beside live tensors</th></tr></thead><tbody>")
        for d in devs:
            body.append(f"<tr><td>{esc(d.get('device'))}</td><td>{esc(d.get('verdict'))}</td>"
                        + "".join(f"<td class=\"num\">{esc(fmt_value(d.get(k), 'bytes'))}</td>" for k in
                                  ("reserved_bytes", "allocated_bytes", "inactive_bytes", "largest_free_block_bytes"))
                        + f"<td class=\"num\">{esc(fmt_value(d.get('external_fragmentation'), 'ratio'))}</td>"
                        + "".join(f"<td class=\"num\">{esc(fmt_value(d.get(k), 'bytes'))}</td>" for k in
                                  ("releasable_bytes", "non_releasable_inactive_bytes")) + "</tr>")
            for o in d.get("ooms") or []:
                body.append(f"<tr><td></td><td colspan=\"8\">OOM: {esc(fmt_value(o.get('size_bytes'), 'bytes'))} "
                            f"on stream {esc(o.get('stream'))} → <b>{esc(o.get('classification'))}</b>: "
                            f"{esc(o.get('reason'))}</td></tr>")
        body.append("</tbody></table>")
    body.append("<h2>Segment map</h2>")
    if map_rows:
        shown = (f"{len(map_rows)} of {segments_in_scope} segments, those with the most free bytes"
                 if len(map_rows) < segments_in_scope else f"all {len(map_rows)} segments")
        cells = len(str(map_rows[0].get("map") or "")) or 1
        from .svg import MAP_COLOURS

        body.append('<div class="legend">' + "".join(
            f'<span><i class="sw box" style="background:{c};outline:1px solid #bbb"></i>{esc(n)}</span>'
            for k, (n, c) in MAP_COLOURS.items() if k != " ") + "</div>")
        body.append(f'<p class="small">{esc(shown)}, in address order; each bar is one segment (not to scale '
                    f'between segments), one cell = 1/{cells} of it.</p>')
        body.append(segment_map(map_rows, "Allocator segments", chart_id="chart-segments"))
    else:
        body.append('<p class="absent">No segments in scope.</p>')
    body += _findings_section(findings, doc.get("inconclusive") or [], list(doc.get("notes") or []))
    return _page(f"fragscope snapshot: {doc.get('source', '')}", body)


def rank_findings_dicts(fs: list[dict]) -> list[dict]:
    rank = {"critical": 2, "warning": 1, "info": 0}
    return sorted(fs, key=lambda f: (-rank.get(f.get("severity"), 0), -float(f.get("confidence") or 0),
                                     str(f.get("id"))))


__all__ = ["render_html", "render_trace_html", "render_snapshot_html", "copy_snippets", "CSP"]
