"""The HTML reports in a real browser (Debian's headless chromium): no console message (no error, no
blocked load or script: the page is self-contained), every chart laid out with drawn marks, and a
screenshot kept as an artefact ($FRAGSCOPE_ARTIFACTS, else pytest's tmp dir).

Skipped when no chromium is installed (``apt-get install -y chromium``; .ci/run installs it).
"""
from __future__ import annotations

import base64
import hashlib
import html as html_lib
import json
import os
import re
import shutil
import struct
import subprocess

import pytest

from fragscope.report import render_html, render_snapshot_html, render_trace_html

from report_common import ROOT, agent_state, example, serve_agent

CHROME = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = [pytest.mark.e2e,  # headless chromium: ~30 s on 2 cores
              pytest.mark.skipif(CHROME is None, reason="no chromium (apt-get install -y chromium)")]
WIDTH, HEIGHT = 1200, 3000

# test-only: measures each chart after layout; added to a copy of the page whose CSP allows exactly
# this script (by its hash), so any other script or load is still refused and logged
_MEASURE_JS = """
const out = [];
for (const svg of document.querySelectorAll('svg.chart')) {
  const r = svg.getBoundingClientRect();
  let drawn = 0, marks = 0;
  for (const el of svg.querySelectorAll('.series')) {
    marks++;
    const b = el.getBBox();
    if (b.width > 0 || b.height > 0) drawn++;
  }
  out.push({id: svg.id, width: r.width, height: r.height, marks: marks, drawn: drawn});
}
const pre = document.createElement('pre');
pre.id = 'measure';
pre.hidden = true;
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
"""


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    d = os.environ.get("FRAGSCOPE_ARTIFACTS") or str(tmp_path_factory.mktemp("artefacts"))
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    return str(tmp_path_factory.mktemp("chromium-profile"))


def chromium(url: str, profile: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [CHROME, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
           "--disable-extensions", "--disable-background-networking", "--disable-dev-shm-usage", "--no-proxy-server",
           "--hide-scrollbars",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", f"--window-size={WIDTH},{HEIGHT}",
           *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def console_messages(stderr: str) -> list[str]:
    """What the page wrote to the console (errors, CSP violations, blocked loads): chromium logs each
    as ``INFO:CONSOLE...] "message", source: URL (line)``."""
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln]


def png_size(path: str) -> tuple[int, int]:
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def with_measurement(html: str) -> str:
    from fragscope.report import CSP

    digest = base64.b64encode(hashlib.sha256(_MEASURE_JS.encode()).digest()).decode()
    assert f'content="{CSP}"' in html
    html = html.replace(f'content="{CSP}"', f'content="{CSP}; script-src \'sha256-{digest}\'"')
    return html.replace("</body>", f"<script>{_MEASURE_JS}</script></body>")


def look(url: str, png: str, profile: str) -> tuple[str, list[dict] | None]:
    """Open ``url`` once: screenshot to ``png``, no console message, the DOM after load, and the
    charts' measurements when the page carries the measuring script."""
    r = chromium(url, profile, f"--screenshot={png}", "--dump-dom")
    assert os.path.exists(png), r.stderr[-2000:]
    assert console_messages(r.stderr) == []
    assert png_size(png) == (WIDTH, HEIGHT)
    assert os.path.getsize(png) > 30_000  # a blank page compresses to a few KB
    m = re.search(r'<pre id="measure" hidden="">(.*?)</pre>', r.stdout, re.S)
    return r.stdout, (json.loads(html_lib.unescape(m.group(1))) if m else None)


def open_report(html: str, name: str, artefacts: str, profile: str) -> list[dict]:
    """Keep the report as an artefact, open a measured copy, return the charts' measurements."""
    with open(os.path.join(artefacts, f"{name}.html"), "w") as fh:
        fh.write(html)
    measured = os.path.join(artefacts, f"{name}.measured.html")
    with open(measured, "w") as fh:
        fh.write(with_measurement(html))
    _, charts = look("file://" + measured, os.path.join(artefacts, f"{name}.png"), profile)
    assert charts is not None
    return charts


def test_console_check_catches_what_the_policy_blocks(tmp_path, profile):
    """Negative control: an inline script under the report's CSP is refused and logged, so an empty
    console in the tests below means something."""
    from fragscope.report import CSP

    page = tmp_path / "blocked.html"
    page.write_text(f'<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="{CSP}">'
                    "</head><body><script>console.error('ran')</script></body></html>")
    msgs = console_messages(chromium("file://" + str(page), profile, "--dump-dom").stderr)
    assert msgs and "Content Security Policy" in msgs[0] and "ran" not in " ".join(msgs)


def test_diagnosis_report_in_chromium(artefacts, profile):
    w, rep = example("fragmentation-incident")
    charts = open_report(render_html(rep, w), "report-fragmentation", artefacts, profile)
    ids = {c["id"] for c in charts}
    assert {"chart-timeline", "chart-memory-gpu0", "chart-kv", "chart-ttft", "chart-gaps", "chart-clock-gpu0"} <= ids
    for c in charts:
        assert c["width"] > 0.8 * (WIDTH - 60) and c["height"] > 100, c  # laid out across the page
        assert c["marks"] > 0 and c["drawn"] == c["marks"], c  # every line has a non-empty box


def test_trace_and_snapshot_reports_in_chromium(artefacts, profile):
    from fragscope.trace_pipeline import analyse_trace_file
    from fragscope.model import Inconclusive, Report
    from fragscope.playbooks import attach_playbooks

    a, findings = analyse_trace_file(os.path.join(ROOT, "tests", "data", "trace", "hta_timeline_sampled_rank0.json.gz"))
    rep = attach_playbooks(Report(window=(a["window"]["start"], a["window"]["end"]), findings=findings,
                                  inconclusive=[Inconclusive(**i) for i in a["inconclusive"]], source=a["source"]))
    trace_html = render_trace_html(a, rep)

    from fragscope.collectors.snapshot import read_snapshot
    from fragscope.detectors.snapshot_map import segment_map_rows
    from fragscope.playbooks.snapshot import diagnose_snapshot

    snap = read_snapshot(os.path.join(ROOT, "tests", "data", "snapshot", "fragmented_oom.pickle"))
    doc, _ = diagnose_snapshot(snap)
    snap_html = render_snapshot_html(doc, *segment_map_rows(snap, None, limit=40, width=160))
    for name, html, expect in (("trace", trace_html, {"chart-busy-idle", "chart-gaps-gpu0"}),
                               ("snapshot", snap_html, {"chart-segments"})):
        charts = open_report(html, f"report-{name}", artefacts, profile)
        assert expect <= {c["id"] for c in charts}
        assert all(c["marks"] > 0 and c["drawn"] == c["marks"] and c["width"] > 500 for c in charts), charts


def test_agent_page_in_chromium(artefacts, profile):
    st, cfg = agent_state("kv-pressure-incident")
    srv, url = serve_agent(st, cfg)
    try:
        # the browser's own Accept header gets the page (no ?format=html)
        dom, _ = look(url + "/", os.path.join(artefacts, "agent-page.png"), profile)
        assert "kv-cache-pressure" in dom and 'id="chart-kv"' in dom and "Last diagnosis" in dom
        assert re.search(r'<path d="M[0-9.]+,[0-9.]+L', dom)
    finally:
        srv.shutdown()
        srv.server_close()
