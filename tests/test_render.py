"""Terminal rendering of a Report: layout at 100 columns, the +/- legend, sparklines, fixes printed
once, singular units, colour only when asked; JSON unchanged."""
from __future__ import annotations

import io
import json
import os
import re

import numpy as np
import pytest

from fragscope.cli.render import SPARK, print_report, render_human, sparkline
from fragscope.collectors.exposition import read_recording
from fragscope.model import Evidence, Finding, Inconclusive, Report, Severity
from fragscope.report.fmt import fmt_value

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def frag():
    w = read_recording(os.path.join(ROOT, "examples", "fragmentation-incident.om.gz"))
    from fragscope.pipeline import diagnose

    return w, diagnose(w)


def _long_report() -> Report:
    long = "word " * 60  # 300 characters: must wrap
    f = Finding("kv-cache-pressure", Severity.WARNING, 0.75, "KV cache full; " + long, onset=1_767_225_600.0,
                evidence=[Evidence("requests_waiting", 1.0, 0.0, 1.0, "requests", note=long),
                          Evidence("ttft_p99_seconds", 18.45, 0.415, 1.25, "seconds", agrees=False)],
                playbook={"actions": ["Cap --max-num-seqs at ~133 " + long, "Same fix.", "Same fix."],
                          "immediate": ["shed load"]})
    return Report(window=(1_767_225_000.0, 1_767_226_000.0), findings=[f],
                  inconclusive=[Inconclusive("launch-bound", ["fragscope_kernel_gap_seconds"], "no traces " + long)],
                  source="rec.om")


def _human(report: Report, window=None, color=None) -> str:
    buf = io.StringIO()
    render_human(report, buf, window=window, color=color)
    return buf.getvalue()


def test_plain_output_wraps_under_its_text_at_100_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    out = _human(_long_report())
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= 100
    assert all(ln == ln.rstrip() for ln in lines)  # no padding to the width
    assert not ANSI.search(out)  # not a terminal: plain text
    # only the header, the table and the finding titles start at column 0 ("Could not judge" too)
    col0 = [ln for ln in lines if ln and not ln.startswith(" ")]
    allowed = ("fragscope ", "#", "─", "1 ", "1. WARNING", "Could not judge")
    assert all(ln.startswith(allowed) for ln in col0), col0
    # a wrapped fix continues under the fix's text, not under "fix:"
    i = next(k for k, ln in enumerate(lines) if ln.lstrip().startswith("fix: Cap --max-num-seqs"))
    text_col = lines[i].index("Cap")
    assert lines[i + 1].startswith(" " * text_col) and lines[i + 1][text_col] != " "


def test_legend_explains_markers_and_against_is_marked(monkeypatch):
    out = _human(_long_report())
    assert "+ agrees, - checked and speaks against" in out
    assert re.search(r"^\s+- ttft_p99_seconds: 18\.45 s", out, re.M)
    assert re.search(r"^\s+\+ requests_waiting: 1 request baseline 0 requests threshold 1 request", out, re.M)


def test_same_fix_printed_once():
    out = _human(_long_report())
    assert out.count("Same fix.") == 1
    assert "now: shed load" not in out  # "now" only when there is no computed fix


@pytest.mark.parametrize("v,unit,text", [(1.0, "requests", "1 request"), (0.0, "requests", "0 requests"),
                                         (2.0, "requests", "2 requests"), (1.0, "tokens", "1 token"),
                                         (1.0, "tokens/s", "1 tokens/s"), (1.0, "/min", "1 /min"),
                                         (1200.0, "tokens", "1,200 tokens"), (None, "requests", "n/a")])
def test_singular_units(v, unit, text):
    assert fmt_value(v, unit) == text


def test_sparkline_shape_and_onset_mark():
    v = np.r_[np.zeros(8), np.arange(1.0, 9.0)]  # flat, then rising
    s = sparkline(v, 16)
    assert len(s) == 16 and s[:8] == SPARK[0] * 8 and s[-1] == SPARK[-1]
    assert list(s[8:]) == sorted(s[8:])  # monotone rise stays monotone
    assert sparkline(v, 16, mark_at=8)[8] == "│"
    gap = v.copy()
    gap[:4] = np.nan
    assert sparkline(gap, 16).startswith("    ")  # no data is blank, not the lowest bar
    assert sparkline(np.full(5, np.nan)) == ""


def test_sparklines_follow_the_recorded_signals(frag):
    w, rep = frag
    out = _human(rep, window=w)
    line = next(ln for ln in out.splitlines() if "torch_fragmentation_ratio:" in ln)
    sp = line.split("+", 1)[1].strip().split(" ")[0]
    assert "│" in sp  # the onset is inside the window
    before, after = sp.split("│")
    # fragmentation 5 % before the onset, 34 % at the end: low before, highest bar last
    assert set(before) == {SPARK[0]} and after[-1] == SPARK[-1]
    tput = next(ln for ln in out.splitlines() if "generation_tokens_per_second:" in ln)
    assert tput.split("+", 1)[1].strip().split(" ")[0].endswith(SPARK[0])  # throughput fell to its lowest


def test_colour_only_when_asked(frag):
    _, rep = frag
    assert not ANSI.search(_human(rep, color=False))

    class Tty(io.StringIO):
        def isatty(self):
            return True

    import sys

    tty = Tty()
    old = sys.stdout
    sys.stdout = tty
    try:
        render_human(rep, tty)
        coloured = tty.getvalue()
        tty2 = Tty()
        sys.stdout = tty2
        render_human(rep, tty2, color=False)
        plain = tty2.getvalue()
    finally:
        sys.stdout = old
    assert ANSI.search(coloured) and "\x1b[1;31m" in coloured  # critical in bold red
    assert not ANSI.search(plain)


def test_json_output_is_unchanged_by_window_and_html(frag, tmp_path):
    w, rep = frag
    a, b = io.StringIO(), io.StringIO()
    print_report(rep, "json", file=a)
    print_report(rep, "json", file=b, window=w, html=str(tmp_path / "r.html"))
    assert a.getvalue() == b.getvalue()
    assert json.loads(a.getvalue()) == json.loads(json.dumps(rep.to_dict(), default=str))
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_no_finding_and_inconclusive_wording():
    out = _human(Report(window=(0.0, 1.0), inconclusive=[Inconclusive("memory-leak", ["x"], "short window")]))
    assert "No finding. Some detectors could not judge" in out and "memory-leak:" in out
    assert _human(Report(window=(0.0, 1.0))).splitlines()[-1] == "No finding."


def test_text_from_the_input_is_never_markup():
    f = Finding("x", Severity.WARNING, 0.5, "[red]not markup[/red] \x1b[31m", evidence=[
        Evidence("[bold]sig[/bold]", 1.0, note="[link=http://e]n[/link]")],
        playbook={"actions": ["[blink]fix[/blink]"]})
    out = _human(Report(window=(0.0, 1.0), findings=[f], source="[i]src[/i]"), color=True)
    for literal in ("[red]not markup[/red]", "[bold]sig[/bold]", "[link=http://e]n[/link]", "[blink]fix[/blink]",
                    "[i]src[/i]"):
        assert literal in ANSI.sub("", out)


def test_control_characters_from_the_input_never_reach_the_terminal():
    f = Finding("x\x1b[2J", Severity.WARNING, 0.5, "a\x1b]0;title\x07b", subject={"gpu": "[red]0\x1b[5m"},
                evidence=[Evidence("s\x9b31m", 1.0, note="\x00")], missing=["m\x1b"],
                playbook={"actions": ["fix\x1b[31m"]})
    rep = Report(window=(0.0, 1.0), findings=[f], source="src\x1b[5m",
                 inconclusive=[Inconclusive("i\x1b", ["m\x1b"], "r\x1b")], signals={"notes": ["n\x1b"]})
    for color in (False, True):
        out = ANSI.sub("", _human(rep, color=color)) if color else _human(rep, color=color)
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out.replace("\n", "")), repr(out)
        assert "a\\x1b]0;title\\x07b" in out and "gpu=[red]0\\x1b[5m" in out


def test_a_level_verdict_says_so():
    f = Finding("kv-cache-pressure", Severity.WARNING, 0.5, "s", basis="level")
    assert "(judged on the present level)" in _human(Report(window=(0.0, 1.0), findings=[f]))
    f.basis = "change"
    assert "judged on" not in _human(Report(window=(0.0, 1.0), findings=[f]))
