"""Server-side SVG charts: time-series panels, horizontal share bars, bar charts, segment maps.

Why SVG drawn here and not a charting library inlined in the page: the report must open offline, from
an attachment or the agent's pod, and its text comes from untrusted files. Static SVG needs no script
at all, so the page ships with ``Content-Security-Policy: default-src 'none'`` (nothing can load or run,
even if an escape were missed); it prints, and it stays small: the fragmentation example's report
with eight panels is about 90 KB, where the smallest capable library (uPlot, ~45 KB minified) would
add its own size plus the data as JSON, and still need script to draw. What SVG gives up is
interactivity (zoom, crosshair); each line carries a ``<title>`` with its range for a hover tooltip.

Every function returns one ``<svg>`` element as a string; all text passes through ``esc``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

import numpy as np

from .fmt import fmt_axis, fmt_clock, fmt_value

# Okabe-Ito palette (colour-blind safe), then darker extras for many GPUs
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#7f7f7f")
ONSET_COLOUR = "#c0392b"
RESTART_COLOUR = "#7f7f7f"
THROTTLE_FILL = "#f5b7b1"

W = 960  # viewBox width; CSS scales it to the page
# Mark labels (page.py: .marklabel is 600 12px system-ui / DejaVu Sans): measured with getComputedTextLength in
# headless chromium on Debian, 'onset kv-cache-pressure' is 166.3 viewBox units and 'threshold crossed
# kv-cache-pressure' 249.9 (7.0-7.2 a character); laid out with 8.4 (a 15 % margin for wider system fonts)
# and a gap, on as many lanes above the plot as keep them apart.
MARK_CHAR_W = 8.4
MARK_GAP = 8.0
MARK_LANE_H = 14
ML, MR = 72, 72  # margins for the left / right axis labels
PLOT_W = W - ML - MR


def esc(x: object) -> str:
    return escape(str(x), quote=True)


@dataclass
class Line:
    label: str
    t: np.ndarray  # unix seconds
    v: np.ndarray  # values in base units, NaN = no data
    colour: str
    dashed: bool = False
    right: bool = False  # plotted against the right axis


@dataclass
class Mark:
    ts: float
    label: str
    colour: str = ONSET_COLOUR
    dashed: bool = True


@dataclass
class Chart:
    title: str
    lines: list[Line]
    unit: str  # left axis unit
    right_unit: str | None = None
    marks: list[Mark] = field(default_factory=list)
    bands: list[tuple[float, float]] = field(default_factory=list)  # shaded time spans (throttling)
    band_label: str = ""
    height: int = 170
    chart_id: str = ""
    label_marks: bool = False  # write the marks' labels (the top panel); others only draw the lines


# ---------------------------------------------------------------------------------------------
def nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About ``n`` round tick values covering [lo, hi] (1, 2, 2.5, 5 x 10^k steps)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(1, n)
    if not (raw > 0 and math.isfinite(raw)):  # a denormal span (5e-324 / 4 is 0) or an overflowed one
        return [lo]
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), raw)
    if not (step > 0 and math.isfinite(step)):
        return [lo]
    first = math.ceil(lo / step - 1e-9) * step
    out = []
    x = first
    while x <= hi + step * 1e-9 and len(out) < 20:
        out.append(round(x, 12))
        x += step
    return out


def nice_bytes_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """Ticks on binary units (8 GiB, 16 GiB, ...) rather than 10^k bytes."""
    unit = 1.0
    for s in (1024**4, 1024**3, 1024**2, 1024):
        if hi >= s:
            unit = s
            break
    return [t * unit for t in nice_ticks(lo / unit, hi / unit, n)]


_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def time_ticks(t0: float, t1: float, n: int = 8) -> list[float]:
    span = t1 - t0
    if span <= 0:
        return [t0]
    step = next((s for s in _TIME_STEPS if span / s <= n), 86400 * math.ceil(span / 86400 / n))
    first = math.ceil(t0 / step) * step
    return [first + i * step for i in range(int((t1 - first) // step) + 1)]


def _scale_max(vals: list[np.ndarray], unit: str) -> float:
    m = 0.0
    for v in vals:
        f = v[np.isfinite(v)]
        if f.size:
            m = max(m, float(f.max()))
    if unit == "ratio":
        return min(1.0, max(m * 1.1, 0.1)) if m > 0 else 1.0
    if m <= 0:
        return 1.0
    return m * 1.08


def _ticks(hi: float, unit: str) -> list[float]:
    return nice_bytes_ticks(0.0, hi) if unit == "bytes" else nice_ticks(0.0, hi)


def decimate(t: np.ndarray, v: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ~2 points per bucket (min and max, in time order): keeps spikes a mean would hide.
    NaN (no data) is kept as a break between runs."""
    n = t.size
    if n <= 2 * buckets:
        return t, v
    edges = np.linspace(0, n, buckets + 1).astype(int)
    keep: list[int] = []
    for a, b in zip(edges[:-1], edges[1:]):
        seg = v[a:b]
        ok = np.isfinite(seg)
        if not ok.any():
            keep.append(a)
            continue
        idx = np.flatnonzero(ok)
        picks = {int(idx[np.argmin(seg[idx])]), int(idx[np.argmax(seg[idx])])}
        if not ok.all():  # a gap inside the bucket stays a gap
            picks.add(int(np.flatnonzero(~ok)[0]))
        keep.extend(a + i for i in sorted(picks))
    ts, vs = t[keep], v[keep]
    return np.asarray(ts, float), np.asarray(vs, float)


def _path(xs: np.ndarray, ys: np.ndarray) -> str:
    """SVG path data; NaN breaks the line (no data is a gap, never a drop to zero). A point alone
    between gaps gets a zero-length segment, which the round line cap draws as a dot."""
    parts = []
    run = 0
    for x, y in zip(xs.tolist(), ys.tolist()):
        if not math.isfinite(y):
            if run == 1:
                parts.append("h0")
            run = 0
            continue
        parts.append(f"{'L' if run else 'M'}{x:.1f},{y:.1f}")
        run += 1
    if run == 1:
        parts.append("h0")
    return "".join(parts)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate(mask.tolist()):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i - 1))
            start = None
    if start is not None:
        out.append((start, mask.size - 1))
    return out


def spans_where(t: np.ndarray, mask: np.ndarray) -> list[tuple[float, float]]:
    """Time spans where ``mask`` holds (for shaded bands)."""
    return [(float(t[a]), float(t[b])) for a, b in _runs(mask)]


_SELF_LABELLED = ("bytes", "ratio", "seconds", "hertz", "")


def layout_mark_labels(items: list[tuple[float, str]], lo: float, hi: float,
                       char_w: float = MARK_CHAR_W, gap: float = MARK_GAP) -> list[dict]:
    """Place mark labels (x of the mark, text) so that none overlaps another: each is written beside its
    mark (after it, or before it when it would cross ``hi``), inside [lo, hi], on the lowest lane where
    it clears every label already there. Returns, in the input order, {x, anchor, lane, x0, x1} (x0-x1:
    the label's extent, for the tests)."""
    order = sorted(range(len(items)), key=lambda i: items[i][0])
    lanes: list[list[tuple[float, float]]] = []
    out: list[dict | None] = [None] * len(items)
    for i in order:
        xm, text = items[i]
        w = len(text) * char_w
        if xm + 4 + w <= hi:
            x0, anchor, xt = xm + 4, "start", xm + 4
        elif xm - 4 - w >= lo:
            x0, anchor, xt = xm - 4 - w, "end", xm - 4
        else:  # longer than the room on either side: from the left edge of the plot
            x0, anchor, xt = lo, "start", lo
        x1 = x0 + w
        lane = next((k for k, spans in enumerate(lanes)
                     if all(x1 + gap <= a or x0 >= b + gap for a, b in spans)), len(lanes))
        if lane == len(lanes):
            lanes.append([])
        lanes[lane].append((x0, x1))
        out[i] = {"x": xt, "anchor": anchor, "lane": lane, "x0": x0, "x1": x1}
    return [o for o in out if o is not None]


def time_chart(c: Chart, t0: float, t1: float) -> str:
    """One panel: lines over [t0, t1], left axis ``c.unit``, optional right axis, onset marks (their
    labels on as many lanes above the plot as keep them from overlapping)."""
    span = (t1 - t0) or 1.0

    def x(t):
        return ML + (np.asarray(t, float) - t0) / span * PLOT_W

    shown = [m for m in c.marks if t0 <= m.ts <= t1]
    placed = (layout_mark_labels([(float(x(m.ts)), m.label) for m in shown if m.label], ML, ML + PLOT_W)
              if c.label_marks else [])
    extra = MARK_LANE_H * max(0, max((p["lane"] for p in placed), default=0))
    h = c.height + extra
    top, bottom = 26 + extra, 24
    ph = h - top - bottom

    left = [ln for ln in c.lines if not ln.right]
    right = [ln for ln in c.lines if ln.right]
    lmax = _scale_max([ln.v for ln in left], c.unit)
    rmax = _scale_max([ln.v for ln in right], c.right_unit or "")

    def y(v, mx):
        return top + ph - np.clip(np.asarray(v, float) / mx, 0, 1.02) * ph

    out = [f'<svg class="chart" id="{esc(c.chart_id)}" viewBox="0 0 {W} {h}" role="img" '
           f'aria-label="{esc(c.title)}" xmlns="http://www.w3.org/2000/svg">',
           f'<title>{esc(c.title)}</title>',
           f'<rect x="{ML}" y="{top}" width="{PLOT_W}" height="{ph}" class="plot"/>']
    for a, b in c.bands:
        xa, xb = float(x(a)), float(x(b))
        out.append(f'<rect x="{xa:.1f}" y="{top}" width="{max(1.0, xb - xa):.1f}" height="{ph}" '
                   f'fill="{THROTTLE_FILL}" opacity="0.55"><title>{esc(c.band_label)}</title></rect>')
    for tv in _ticks(lmax, c.unit):
        yy = float(y(tv, lmax))
        out.append(f'<line x1="{ML}" x2="{ML + PLOT_W}" y1="{yy:.1f}" y2="{yy:.1f}" class="grid"/>')
        out.append(f'<text x="{ML - 6}" y="{yy + 4:.1f}" class="tick" text-anchor="end">'
                   f'{esc(fmt_axis(tv, c.unit))}</text>')
    if right:
        for tv in _ticks(rmax, c.right_unit or ""):
            yy = float(y(tv, rmax))
            out.append(f'<text x="{ML + PLOT_W + 6}" y="{yy + 4:.1f}" class="tick" text-anchor="start">'
                       f'{esc(fmt_axis(tv, c.right_unit or ""))}</text>')
    # unit captions where the tick labels carry none (tokens/s, /min, requests)
    if c.unit not in _SELF_LABELLED:
        out.append(f'<text x="{ML - 6}" y="{top - 10}" class="tick" text-anchor="end">{esc(c.unit)}</text>')
    if right and (c.right_unit or "") not in _SELF_LABELLED:
        out.append(f'<text x="{ML + PLOT_W + 6}" y="{top - 10}" class="tick" text-anchor="start">'
                   f'{esc(c.right_unit)}</text>')
    for tt in time_ticks(t0, t1):
        xx = float(x(tt))
        out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{top + ph}" class="grid"/>')
        out.append(f'<text x="{xx:.1f}" y="{h - 6}" class="tick" text-anchor="middle">'
                   f'{esc(fmt_clock(tt, with_seconds=span < 600))}</text>')
    for ln in c.lines:
        ok = (ln.t >= t0) & (ln.t <= t1)
        tt, vv = decimate(ln.t[ok], ln.v[ok], PLOT_W // 2)
        d = _path(x(tt), y(vv, rmax if ln.right else lmax))
        if not d:
            continue
        fin = vv[np.isfinite(vv)]
        unit = (c.right_unit or "") if ln.right else c.unit
        tip = f"{ln.label}: {fmt_value(float(fin.min()), unit)} – {fmt_value(float(fin.max()), unit)}"
        dash = ' stroke-dasharray="6 4"' if ln.dashed else ""
        out.append(f'<path d="{d}" fill="none" stroke="{esc(ln.colour)}" stroke-width="1.8" stroke-linecap="round"{dash} '
                   f'class="series"><title>{esc(tip)}</title></path>')
    labelled = iter(placed)
    for m in shown:
        xx = float(x(m.ts))
        dash = ' stroke-dasharray="5 3"' if m.dashed else ""
        p = next(labelled) if m.label and c.label_marks else None
        out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top - 4}" y2="{top + ph}" stroke="{esc(m.colour)}" '
                   f'stroke-width="1.5"{dash} class="mark"><title>{esc(m.label)}</title></line>')
        if p:
            out.append(f'<text x="{p["x"]:.1f}" y="{top - 8 - MARK_LANE_H * p["lane"]}" class="marklabel" '
                       f'fill="{esc(m.colour)}" text-anchor="{p["anchor"]}">{esc(m.label)}</text>')
    out.append("</svg>")
    return "".join(out)


# ---------------------------------------------------------------------------------------------
def share_bars(rows: list[tuple[str, list[tuple[str, float, str]]]], title: str, chart_id: str = "") -> str:
    """Horizontal 100 % bars: ``rows`` = [(label, [(part, fraction 0-1, colour), ...]), ...]."""
    bar_h, gap, lab_w = 22, 8, 150
    h = 10 + len(rows) * (bar_h + gap) + 10
    bw = W - lab_w - 20
    out = [f'<svg class="chart" id="{esc(chart_id)}" viewBox="0 0 {W} {h}" role="img" aria-label="{esc(title)}" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>']
    for i, (label, parts) in enumerate(rows):
        yy = 10 + i * (bar_h + gap)
        out.append(f'<text x="{lab_w - 8}" y="{yy + bar_h * 0.7:.1f}" class="tick" text-anchor="end">'
                   f'{esc(label)}</text>')
        out.append(f'<rect x="{lab_w}" y="{yy}" width="{bw}" height="{bar_h}" class="plot"/>')
        xx = float(lab_w)
        for part, frac, colour in parts:
            if frac is None or not math.isfinite(frac) or frac <= 0:
                continue
            wpx = frac * bw
            out.append(f'<rect x="{xx:.1f}" y="{yy}" width="{wpx:.1f}" height="{bar_h}" fill="{esc(colour)}" '
                       f'class="series"><title>{esc(f"{label}: {part} {frac * 100:.1f} %")}</title></rect>')
            if wpx > 46:
                out.append(f'<text x="{xx + wpx / 2:.1f}" y="{yy + bar_h * 0.7:.1f}" class="inbar" '
                           f'text-anchor="middle">{esc(f"{frac * 100:.0f} %")}</text>')
            xx += wpx
    out.append("</svg>")
    return "".join(out)


def bar_chart(labels: list[str], values: list[float | None], unit: str, title: str, log: bool = False,
              colour: str = PALETTE[0], chart_id: str = "") -> str:
    """Vertical bars (e.g. a gap histogram, or gap quantiles on a log axis). None = not available."""
    h, top, bottom = 220, 16, 40
    ph = h - top - bottom
    n = max(1, len(values))
    slot = PLOT_W / n
    fin = [v for v in values if v is not None and math.isfinite(v) and (v > 0 or not log)]
    out = [f'<svg class="chart" id="{esc(chart_id)}" viewBox="0 0 {W} {h}" role="img" aria-label="{esc(title)}" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>',
           f'<rect x="{ML}" y="{top}" width="{PLOT_W}" height="{ph}" class="plot"/>']
    if log and fin:
        lo = 10 ** math.floor(math.log10(min(fin)))
        hi = 10 ** math.ceil(math.log10(max(fin)) + 1e-9)
        if hi <= lo:
            hi = lo * 10

        def y(v):
            return top + ph - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * ph
        ticks, k = [], lo
        while k <= hi * 1.0001:
            ticks.append(k)
            k *= 10
    else:
        hi = _scale_max([np.asarray(fin, float)], unit) if fin else 1.0

        def y(v):
            return top + ph - min(v / hi, 1.02) * ph
        ticks = _ticks(hi, unit)
    for tv in ticks:
        yy = y(tv)
        out.append(f'<line x1="{ML}" x2="{ML + PLOT_W}" y1="{yy:.1f}" y2="{yy:.1f}" class="grid"/>')
        out.append(f'<text x="{ML - 6}" y="{yy + 4:.1f}" class="tick" text-anchor="end">'
                   f'{esc(fmt_axis(tv, unit))}</text>')
    for i, (lab, v) in enumerate(zip(labels, values)):
        x0 = ML + i * slot + slot * 0.12
        bw = slot * 0.76
        out.append(f'<text x="{x0 + bw / 2:.1f}" y="{h - bottom + 16}" class="tick" text-anchor="middle">'
                   f'{esc(lab)}</text>')
        if v is None or not math.isfinite(v) or (log and v <= 0):
            out.append(f'<text x="{x0 + bw / 2:.1f}" y="{top + ph - 6}" class="tick" text-anchor="middle">n/a</text>')
            continue
        yy = y(v)
        out.append(f'<rect x="{x0:.1f}" y="{yy:.1f}" width="{bw:.1f}" height="{max(0.5, top + ph - yy):.1f}" '
                   f'fill="{esc(colour)}" class="series"><title>{esc(f"{lab}: {fmt_value(v, unit)}")}</title></rect>')
        out.append(f'<text x="{x0 + bw / 2:.1f}" y="{yy - 4:.1f}" class="tick" text-anchor="middle">'
                   f'{esc(fmt_value(v, unit))}</text>')
    out.append("</svg>")
    return "".join(out)


MAP_COLOURS = {"#": ("allocated", "#0072B2"), "+": ("rounding waste", "#56B4E9"), "~": ("pending free", "#E69F00"),
               ".": ("free", "#e8e8e8"), ":": ("used and free", "#CC79A7"), " ": ("empty", "#ffffff")}


def segment_map(rows: list[dict], title: str, chart_id: str = "") -> str:
    """One bar per allocator segment, each cell coloured by the state holding most of it
    (``rows`` from detectors.snapshot.segment_map_rows)."""
    bar_h, gap, lab_w, free_w = 16, 6, 270, 150
    h = 8 + len(rows) * (bar_h + gap) + 4
    bw = W - lab_w - free_w
    out = [f'<svg class="chart" id="{esc(chart_id)}" viewBox="0 0 {W} {h}" role="img" aria-label="{esc(title)}" '
           f'xmlns="http://www.w3.org/2000/svg"><title>{esc(title)}</title>']
    for i, r in enumerate(rows):
        yy = 8 + i * (bar_h + gap)
        cells = str(r.get("map") or "")
        label = (f"gpu{r.get('device')} {int(r.get('address', 0)):#x} {fmt_value(r.get('total_size'), 'bytes')}"
                 f" s{r.get('stream')}")
        out.append(f'<text x="{lab_w - 8}" y="{yy + bar_h * 0.78:.1f}" class="tick mono" text-anchor="end">'
                   f'{esc(label)}</text>')
        cw = bw / max(1, len(cells))
        # merge equal neighbours into one rect: fewer elements
        k = 0
        while k < len(cells):
            j = k
            while j + 1 < len(cells) and cells[j + 1] == cells[k]:
                j += 1
            name, colour = MAP_COLOURS.get(cells[k], ("?", "#999999"))
            out.append(f'<rect x="{lab_w + k * cw:.1f}" y="{yy}" width="{(j - k + 1) * cw:.1f}" height="{bar_h}" '
                       f'fill="{colour}" class="series"><title>{esc(name)}</title></rect>')
            k = j + 1
        out.append(f'<rect x="{lab_w}" y="{yy}" width="{bw}" height="{bar_h}" fill="none" stroke="#999"/>')
        free = f"free {fmt_value(r.get('inactive_bytes'), 'bytes')} in {r.get('free_blocks', '?')}"
        out.append(f'<text x="{lab_w + bw + 8}" y="{yy + bar_h * 0.78:.1f}" class="tick">{esc(free)}</text>')
    out.append("</svg>")
    return "".join(out)
