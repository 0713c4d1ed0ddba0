"""The HTML page of a kernel-timeline analysis (``diagnose trace --html``): busy/idle share per device
and stream, the kernel-gap distribution, the host side, and the findings."""
from __future__ import annotations

from ..model import Report
from .fmt import fmt_value
from .page import header, page
from .sections import findings_section, summary_table
from .svg import PALETTE, bar_chart, esc, share_bars

def render_trace_html(analysis: dict, report: Report, *, generated_at: float | None = None) -> str:
    """A kernel-timeline analysis (detectors.timeline): busy/idle share per device and stream, the
    kernel-gap distribution, the host side, and the findings."""
    a = analysis
    w = a.get("window") or {}
    sel = a.get("selection") or {}
    extra = (f"{esc(a.get('format', ''))} · span {esc(fmt_value(w.get('span_seconds'), 'seconds'))} · "
             f"{esc(sel.get('ops_analysed', '?'))} of {esc(sel.get('ops_total', '?'))} GPU ops analysed")
    body = [header("trace", a.get("source", ""), (w.get("start"), w.get("end")), extra, generated_at)]
    findings = report.to_dict()["findings"]
    body.append(summary_table(findings))
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
    body += findings_section(findings, d["inconclusive"], list(a.get("notes") or []))
    return page(f"fragscope trace: {a.get('source', '')}", body)

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
