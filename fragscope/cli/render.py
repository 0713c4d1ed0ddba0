"""Terminal and JSON rendering of a Report (rich on a TTY, plain text otherwise), and --html files.

Human output: a ranked table of the findings, then each finding with its summary, its evidence (a
sparkline of each signal around the onset when the window is at hand) and its fixes. Long lines wrap
under their own text, never back to column 0. Colour only on a terminal and without --no-color
(or NO_COLOR); piped output is plain text, 100 columns unless COLUMNS says otherwise.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from typing import TYPE_CHECKING

from ..model import Report, Severity, rank_findings
from ..report.fmt import fmt_ts, fmt_value  # noqa: F401  (re-exported: trace, snapshot, logs, fleet use them)

if TYPE_CHECKING:
    import numpy as np

# what a verdict rests on (model.Finding.basis), when it is not a change against the window's baseline
_BASIS = {"level": "judged on the present level", "snapshot": "from a memory snapshot", "trace": "from a trace",
          "log": "from engine logs"}
_SEV_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 16  # cells of a sparkline
PLAIN_WIDTH = 100  # columns when output is not a terminal


def sources_down(report: Report) -> list[str]:
    """The sources that were down while the report was judged (``signals.sources_down``)."""
    down = report.signals.get("sources_down") if isinstance(report.signals, dict) else None
    return [str(d) for d in down] if isinstance(down, list) else []


def report_exit_code(report: Report, fail_on: str) -> int:
    """1 for a finding at or above ``fail_on``; else 4 when a source was down (the verdict is
    incomplete: never a silent 0, whatever ``fail_on``); else 0. docs/cli.md#exit-codes."""
    from .base import EXIT_SOURCES_DOWN

    if fail_on != "never" and any(f.severity.rank >= Severity(fail_on).rank for f in report.findings):
        return 1
    return EXIT_SOURCES_DOWN if sources_down(report) else 0


def print_report(report: Report, fmt: str = "human", file=None, window=None, color: bool | None = None,
                 html: str | None = None) -> None:
    """Print ``report`` as ``fmt`` (human | json); with ``html``, also write the HTML report there
    (``window`` gives its timeline and the terminal's sparklines)."""
    out = file or sys.stdout
    if html:
        from ..report import render_html

        write_html(html, render_html(report, window))
    if fmt == "json":
        out.write(json.dumps(report.to_dict(), indent=2, default=json_default) + "\n")
        return
    render_human(report, out, window=window, color=color)


def write_html(path: str, text: str) -> None:
    """Write an HTML report; a path that cannot be written is a one-line usage error (exit 2)."""
    from .common import fail

    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as e:
        fail(f"--html {path}: {e.strerror or e}")


def json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)


def _fmt_window(w) -> str:
    a, b = fmt_ts(w[0]), fmt_ts(w[1])
    if a[:10] == b[:10] and a != "?":
        return f"{a} → {b[11:]}"  # same day: the date once
    return f"{a} → {b}"


def sparkline(values: np.ndarray, width: int = SPARK_WIDTH, mark_at: int | None = None) -> str:
    """Unicode sparkline of ``values`` in ``width`` cells (mean per cell, scaled min..max of the
    values); a cell without data is a space; ``mark_at`` inserts ``│`` before that cell (the onset)."""
    import numpy as np  # (here: diagnose trace renders without numpy)

    v = np.asarray(values, float)
    if v.size == 0 or not np.isfinite(v).any():
        return ""
    edges = np.linspace(0, v.size, width + 1).astype(int)
    cells = []
    for a, b in zip(edges[:-1], edges[1:]):
        seg = v[a:max(b, a + 1)]
        seg = seg[np.isfinite(seg)]
        cells.append(float(seg.mean()) if seg.size else math.nan)
    fin = [c for c in cells if math.isfinite(c)]
    lo, hi = min(fin), max(fin)
    chars = []
    for c in cells:
        if not math.isfinite(c):
            chars.append(" ")
        elif hi <= lo:
            chars.append(SPARK[0])
        else:
            chars.append(SPARK[min(len(SPARK) - 1, int((c - lo) / (hi - lo) * len(SPARK)))])
    if mark_at is not None and 0 <= mark_at <= width:
        chars.insert(mark_at, "│")
    return "".join(chars)


def _spark_range(frame, onset: float | None) -> tuple[int, int, int | None]:
    """Grid indices [lo, hi) around the onset (as much before it as after it, up to the window's
    start) and the onset's cell in a SPARK_WIDTH sparkline."""
    t = frame.t
    n = t.size
    if onset is None or not math.isfinite(onset) or not (t[0] < onset <= t[-1]):
        return 0, n, None
    import numpy as np

    i_on = int(np.searchsorted(t, onset))
    after = n - i_on
    lo = max(0, i_on - after)
    cell = int(round((i_on - lo) / max(1, n - lo) * SPARK_WIDTH))
    return lo, n, cell


def render_human(report: Report, out, window=None, color: bool | None = None) -> None:
    from rich.console import Console

    tty = out is sys.stdout and out.isatty()
    if color is None:
        color = tty and not os.environ.get("NO_COLOR")
    width = None
    if not tty:
        try:
            width = int(os.environ.get("COLUMNS", ""))
        except ValueError:
            width = None
        width = width if width and width >= 40 else PLAIN_WIDTH
    import io

    # plain text is rendered into a buffer and written with trailing blanks stripped (rich pads
    # every line to the console width)
    sink = out if color else io.StringIO()
    console = Console(file=sink, highlight=False, force_terminal=bool(tty and color), width=width,
                      color_system="auto" if color else None, no_color=not color, emoji=False)
    try:
        _render(report, console, window)
    finally:
        if not color:
            out.write("".join(ln.rstrip() + "\n" for ln in sink.getvalue().splitlines()))


def _render(report: Report, console, window) -> None:
    from rich import box
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    def T(s: object = "", style: str = "") -> Text:  # noqa: N802 - all text from the input goes through here
        return Text(clean(s), style=style)

    def line(text: Text | str, indent: int = 0) -> None:
        console.print(Padding(text if isinstance(text, Text) else T(text), (0, 0, 0, indent), expand=False))

    def labelled(label: str, text: str, indent: int = 3, style: str = "bold") -> None:
        g = Table.grid(padding=(0, 1))
        g.add_column(no_wrap=True)
        g.add_column(overflow="fold")
        g.add_row(T(label, style=style), T(text))
        console.print(Padding(g, (0, 0, 0, indent), expand=False))

    down = sources_down(report)
    if down:  # the first line: a verdict judged without a source must not read as healthy
        warn = Text()
        warn.append("SOURCES DOWN", style="bold red")
        warn.append(clean(f": this verdict is incomplete (exit 4): {'; '.join(down)}"))
        line(warn)
    start, end = report.window
    head = Text()
    head.append("fragscope", style="bold")
    head.append(clean(f" {report.source or 'input'}  window {fmt_ts(start)} → {fmt_ts(end)}"))
    line(head)
    findings = rank_findings(report.findings)
    if not findings:
        line("No finding." + (" Some sources were down (above): this is not a clean bill of health." if down else
                              " Some detectors could not judge (below): this is not a clean bill of health."
                              if report.inconclusive else ""))
    else:
        tbl = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1))
        for col, kw in (("#", {"justify": "right"}), ("severity", {}), ("diagnosis", {}),
                        ("confidence", {"justify": "right"}), ("subject", {}), ("onset", {"no_wrap": True})):
            tbl.add_column(col, **kw)
        for i, f in enumerate(findings, 1):
            tbl.add_row(str(i), T(f.severity.value.upper(), style=_SEV_STYLE.get(f.severity.value, "")),
                        T(f.id, style="bold"), f"{f.confidence:.2f}", T(_subject(f.subject)), fmt_ts(f.onset))
        console.print()
        console.print(tbl)

    frame = None
    if window is not None and findings:
        try:
            from ..report.series import frame_of

            frame = frame_of(window)
        except Exception:  # noqa: BLE001 - sparklines are a garnish: never fail the report for them
            frame = None

    for i, f in enumerate(findings, 1):
        title = Text()
        title.append(f"{i}. {f.severity.value.upper()}", style=_SEV_STYLE.get(f.severity.value, ""))
        title.append(" ")
        title.append(clean(f.id), style="bold")
        subject = _subject(f.subject)
        title.append(clean(f"  confidence {f.confidence:.2f}{'  ' + subject if subject else ''}  onset {fmt_ts(f.onset)}"
                           + (f"  ({_BASIS[f.basis]})" if getattr(f, "basis", "change") in _BASIS else "")))
        console.print()
        line(title)
        line(f.summary, 3)
        wins = [e.window for e in f.evidence if e.window]
        common_win = max(set(wins), key=wins.count) if wins else None
        if f.evidence:
            spark_lo = spark_cell = None
            if frame is not None:
                spark_lo, _, spark_cell = _spark_range(frame, f.onset)
            legend = "evidence" + (f", recent {_fmt_window(common_win)}" if common_win else "")
            legend += " (+ agrees, - checked and speaks against"
            if frame is not None:
                legend += ("; sparkline: before the onset │ to the end" if spark_cell is not None
                           else "; sparkline: the whole window")
            line(T(legend + "):", style="dim"), 3)
            g = Table.grid(padding=(0, 1))
            g.add_column(no_wrap=True)
            if frame is not None:
                g.add_column(no_wrap=True, width=SPARK_WIDTH + (1 if spark_cell is not None else 0))
            g.add_column(overflow="fold")
            for e in f.evidence:
                mark = T("+", style="green") if e.agrees else T("-", style="red")
                base = f" baseline {fmt_value(e.baseline, e.unit)}" if e.baseline is not None else ""
                thr = f" threshold {fmt_value(e.threshold, e.unit)}" if e.threshold is not None else ""
                win = f" [{_fmt_window(e.window)}]" if e.window and e.window != common_win else ""
                note = f" — {e.note}" if e.note else ""
                body = T(f"{e.signal}: {fmt_value(e.observed, e.unit)}{base}{thr}{win}{note}")
                if frame is not None:
                    from ..report.series import evidence_series

                    arr = evidence_series(frame, e.signal, f.subject)
                    sp = sparkline(arr[spark_lo:], SPARK_WIDTH, spark_cell) if arr is not None else ""
                    g.add_row(mark, T(sp, style="cyan"), body)
                else:
                    g.add_row(mark, body)
            console.print(Padding(g, (0, 0, 0, 3), expand=False))
        if f.missing:
            labelled("missing to be sure:", ", ".join(f.missing), style="dim")
        if f.playbook:
            pb = f.playbook
            actions = _dedupe(pb.get("actions") or [])
            for a in actions[:4]:
                labelled("fix:", a)
            if len(actions) > 4:
                line(T(f"({len(actions) - 4} more fixes: --format json or --html)", style="dim"), 3)
            if not actions and pb.get("immediate"):
                labelled("now:", pb["immediate"][0])
            line(T(f"playbook, preconditions and verification: diagnose explain {f.id}", style="dim"), 3)
        for att in f.attachments:
            labelled("attached:", f"{att.get('kind', 'evidence')}: {att.get('verdict') or ''} "
                                  f"{att.get('summary') or ''}".strip(), style="")
    if report.inconclusive:
        console.print()
        t = Text()
        t.append("Could not judge", style="bold")
        t.append(" (not healthy, just not enough data):")
        line(t)
        for inc in report.inconclusive:
            miss = ", ".join(inc.missing) if inc.missing else ""
            labelled(f"{inc.id}:", f"{inc.reason}{' — missing ' + miss if miss else ''}", style="")
    notes = (report.signals or {}).get("notes") or []
    for n in notes:
        labelled("note:", str(n), indent=0, style="dim")


_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(s: object) -> str:
    """Control characters from untrusted input (an ESC could drive the terminal) shown as ``\\x1b``."""
    return _CTRL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(s))


def _subject(subject: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in subject.items())


def _dedupe(items: list) -> list:
    """The same fix twice (two causes computing one action) is printed once, first position kept."""
    seen: set = set()
    return [x for x in items if not (x in seen or seen.add(x))]


def write_trace_html(path: str, analysis: dict, report: Report) -> None:
    """``diagnose trace --html``: busy/idle share, gap distribution, host side and findings."""
    from ..report import render_trace_html

    write_html(path, render_trace_html(analysis, report))


HTML_MAP_CELLS = 160  # cells per segment in the HTML map (the terminal's has 48)


def write_snapshot_html(path: str, doc: dict, snap, device: int | None, map_limit: int) -> None:
    """``diagnose snapshot --html``: the analysis and a finer per-segment map."""
    from ..detectors.snapshot import segment_map_rows
    from ..report import render_snapshot_html

    rows, in_scope = segment_map_rows(snap, device, limit=map_limit or None, width=HTML_MAP_CELLS)
    write_html(path, render_snapshot_html(doc, rows, in_scope))
