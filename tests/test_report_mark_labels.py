"""Chart mark labels never overlap ("onset kv-cache-pressure" used to be drawn over "threshold crossed
kv-cache-pressure"): checked on the SVG geometry, for a synthetic chart and for the HTML report of the
KV-pressure example incident."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from fragscope.report.svg import (MARK_CHAR_W, ML, PLOT_W, Chart, Line, Mark, layout_mark_labels,
                                  time_chart)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TEXT = re.compile(r'<text x="([-\d.]+)" y="([-\d.]+)" class="marklabel"[^>]*text-anchor="(start|end)">([^<]*)</text>')


def _boxes(svg: str) -> list[tuple[float, float, float, str]]:
    """(x0, x1, baseline y, text) of each mark label, with the layout's own width per character."""
    out = []
    for x, y, anchor, text in _TEXT.findall(svg):
        w = len(text) * MARK_CHAR_W
        x0 = float(x) if anchor == "start" else float(x) - w
        out.append((x0, x0 + w, float(y), text))
    return out


def _assert_apart(boxes) -> None:
    for i, a in enumerate(boxes):
        assert ML <= a[0] and a[1] <= ML + PLOT_W + 0.5, a  # inside the plot's width
        assert a[2] >= 12, a  # inside the viewBox (12 px text)
        for b in boxes[i + 1:]:
            same_line = abs(a[2] - b[2]) < 12
            assert not (same_line and a[0] < b[1] and b[0] < a[1]), (a, b)


def _chart(marks: list[Mark]) -> str:
    t = np.arange(0.0, 8 * 3600.0, 60.0)
    c = Chart("KV cache", [Line("usage", t, np.linspace(0, 1, t.size), "#0072B2")], "ratio", marks=marks,
              label_marks=True)
    return time_chart(c, 0.0, t[-1])


def test_onset_and_threshold_crossed_close_together_do_not_overlap():
    svg = _chart([Mark(9600.0, "onset kv-cache-pressure"),
                  Mark(9000.0, "threshold crossed kv-cache-pressure", "#7b1fa2")])
    boxes = _boxes(svg)
    assert len(boxes) == 2
    _assert_apart(boxes)
    assert len({b[2] for b in boxes}) == 2  # two lanes
    h = float(re.search(r'viewBox="0 0 \d+ (\d+)"', svg).group(1))
    assert h == 170 + 14  # the panel grew by one lane


def test_labels_far_apart_stay_on_one_lane_and_near_the_right_edge_turn_left():
    svg = _chart([Mark(1800.0, "onset a"), Mark(20000.0, "onset b"), Mark(8 * 3600.0 - 200, "restart")])
    boxes = _boxes(svg)
    _assert_apart(boxes)
    assert len({b[2] for b in boxes}) == 1
    assert re.search(r'text-anchor="end">restart<', svg)


@pytest.mark.parametrize("n", [2, 5, 9])
def test_many_marks_in_one_place(n):
    items = [(400.0 + i, f"onset diagnosis-{i}") for i in range(n)]
    placed = layout_mark_labels(items, ML, ML + PLOT_W)
    assert len({p["lane"] for p in placed}) == n  # all overlap in x: one lane each
    for i, a in enumerate(placed):
        for b in placed[i + 1:]:
            assert a["lane"] != b["lane"] or a["x1"] <= b["x0"] or b["x1"] <= a["x0"]


def test_example_incident_report_labels_apart():
    from fragscope.collectors.exposition import read_recording
    from fragscope.pipeline import diagnose
    from fragscope.report import render_html

    w = read_recording(os.path.join(ROOT, "examples", "kv-pressure-incident.om.gz"))
    html = render_html(diagnose(w), w)
    for svg in re.findall(r"<svg.*?</svg>", html, re.S):
        _assert_apart(_boxes(svg))
    assert "onset kv-cache-pressure" in html
