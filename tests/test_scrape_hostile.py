"""Hostile and misdirected inputs to `diagnose FILE` (issue 12 reproducers, issue 11 wrong-file messages):
bounded time and memory, a one-line error naming the cap or the command that reads the file."""
from __future__ import annotations

import gzip
import json
import math
import os
import sqlite3

import pytest

from fragscope.collectors import exposition
from fragscope.collectors.exposition import ParseError, read_recording

from cli_helpers import cli, real_cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
T = 1_800_000_000.0


def _w(tmp_path, name, data):
    p = tmp_path / name
    (p.write_bytes if isinstance(data, bytes) else p.write_text)(data)
    return str(p)


def _print_both(path, capsys):
    """What `diagnose FILE` does after reading, in-process (the crash site was the rendering):
    the human output and JSON, which must parse without NaN/Infinity tokens."""
    from fragscope.cli.render import print_report
    from fragscope.pipeline import diagnose

    report = diagnose(read_recording(path))
    print_report(report, "human")
    capsys.readouterr()
    print_report(report, "json")
    out = capsys.readouterr().out
    return json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def _one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout[-400:], r.stderr[-400:])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


# --- timestamps ---------------------------------------------------------------------------------
@pytest.mark.parametrize("scale,unit", [(1e3, None), (1e6, "microseconds"), (1e9, "nanoseconds")])
def test_timestamp_units_by_magnitude(tmp_path, scale, unit):
    lines = "".join(f"g {i} {int((1_700_000_000 + 15 * i) * scale)}\n" for i in range(3))
    w = read_recording(_w(tmp_path, "r.prom", lines))
    assert w.select("g")[0].ts.tolist() == [1_700_000_000, 1_700_000_015, 1_700_000_030]
    assert any(unit in n for n in w.notes) if unit else not w.notes


def test_timestamps_out_of_range_are_bad_lines(tmp_path):
    good = "".join(f"g {i} {1_700_000_000 + 15 * i}\n" for i in range(100))
    w = read_recording(_w(tmp_path, "r.om", good + "g 1 1e25\ng 1 -5\ng 1 nan\n# EOF\n"))
    assert len(w.select("g")[0]) == 100 and any("3 unparsable lines" in n for n in w.notes)
    with pytest.raises(ParseError, match="out of range"):
        read_recording(_w(tmp_path, "all.om", "g 1 1e25\n" * 3))


def test_far_future_and_microsecond_recordings_print_in_both_formats(tmp_path, capsys):
    """Reproducer: timestamps in µs / past the year 9999 crashed the human output (year out of range)."""
    for name, ts in (("us.prom", 1_700_000_000_000_000), ("y10000.prom", 253_402_300_800),
                     ("ns.prom", 1_700_000_000_000_000_000)):
        body = "".join(f'vllm:num_requests_running{{model_name="m"}} {i} {ts + i * 15 * (ts // 1_700_000_000)}\n'
                       for i in range(3))
        d = _print_both(_w(tmp_path, name, body), capsys)
        assert d["window"]["end"] < 1e11  # converted: every date prints (year < 9999)


# --- values and bounds --------------------------------------------------------------------------
def test_histogram_bucket_le_nan_dropped_and_both_outputs_print(tmp_path, capsys):
    """Reproducer: a bucket le="NaN" crashed both outputs."""
    rows = []
    for i in range(40):
        t = 1_700_000_000 + 15 * i
        for le, c in (("0.1", i), ("NaN", i), ("1.0", 2 * i), ("+Inf", 2 * i)):
            rows.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {c} {t}')
        rows.append(f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {2 * i} {t}')
        rows.append(f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {0.3 * i} {t}')
        rows.append(f'vllm:num_requests_running{{model_name="m"}} 3 {t}')
        rows.append(f'summ{{quantile="NaN"}} 1 {t}')
    p = _w(tmp_path, "h.om", "# TYPE vllm:time_to_first_token_seconds histogram\n# TYPE summ summary\n"
           + "\n".join(rows) + "\n# EOF\n")
    w = read_recording(p)
    les = sorted(s.key.label("le") for s in w.select("vllm:time_to_first_token_seconds_bucket"))
    assert les == ["+Inf", "0.1", "1.0"]
    assert not w.select("summ") and any("2 histogram bucket / summary quantile" in n for n in w.notes)
    _print_both(p, capsys)


def test_huge_and_non_finite_values_dropped_and_counted(tmp_path):
    big = "9" * 5000  # a >4,300-digit integer: float() makes it inf, no int() limit hit
    body = "".join(f"g {v} {1_700_000_000 + 15 * i}\n" for i, v in enumerate(["1", big, "1e400", "-Inf", "NaN", "2"]))
    w = read_recording(_w(tmp_path, "v.om", body + "# EOF\n"))
    s = w.select("g")[0]
    assert s.values.tolist() == [1.0, 2.0] and w.dropped_points == 4


# --- size and shape caps --------------------------------------------------------------------------
def test_gzip_bomb_stops_at_the_cap(tmp_path, monkeypatch):
    """Reproducer: gzip decompressed without a cap (400 KB -> 400 MB of newlines took 103 s)."""
    raw = b"g 1 1700000000\n" + b"x" * (3 << 20)  # 3 MiB once decompressed, ~3 KB compressed
    p = _w(tmp_path, "bomb.om.gz", gzip.compress(raw))
    with pytest.raises(ParseError) as e:
        read_recording(p, max_decompressed_bytes=1 << 20)
    msg = str(e.value)
    assert "1,048,576 bytes" in msg and "FRAGSCOPE_MAX_DECOMPRESSED_BYTES" in msg and "\n" not in msg
    monkeypatch.setenv("FRAGSCOPE_MAX_DECOMPRESSED_BYTES", str(1 << 20))
    with pytest.raises(ParseError, match="cap on decompressed input"):
        read_recording(p)
    monkeypatch.setenv("FRAGSCOPE_MAX_DECOMPRESSED_BYTES", "lots")
    with pytest.raises(ParseError, match="FRAGSCOPE_MAX_DECOMPRESSED_BYTES='lots': not a number"):
        read_recording(p)


def test_newline_bomb_stops_early(tmp_path, monkeypatch):
    monkeypatch.setattr(exposition, "_MAX_LINES_WITHOUT_SAMPLE", 10_000)
    p = _w(tmp_path, "nl.om.gz", gzip.compress(b"g 1 1700000000\n" + b"\n" * 50_000 + b"g 2 1700000015\n"))
    with pytest.raises(ParseError, match="10,000 lines in a row without a sample"):
        read_recording(p)


def test_gzip_members_padding_truncation_corruption(tmp_path):
    a = gzip.compress(b"g 1 1700000000\n")
    b = gzip.compress(b"g 2 1700000015\n# EOF\n")
    w = read_recording(_w(tmp_path, "multi.om.gz", a + b + b"\x00" * 64))
    assert w.select("g")[0].values.tolist() == [1.0, 2.0]
    with pytest.raises(ParseError, match="truncated gzip"):
        read_recording(_w(tmp_path, "trunc.om.gz", (a + b)[:-10]))
    bad = bytearray(gzip.compress(b"g 1 1700000000\n" * 1000))
    bad[20:40] = b"\xff" * 20
    with pytest.raises(ParseError, match="corrupt gzip|truncated gzip"):
        read_recording(_w(tmp_path, "corrupt.om.gz", bytes(bad)))


def test_series_and_points_caps(tmp_path, monkeypatch):
    body = "".join(f'm{{id="{i}"}} 1 {1_700_000_000 + i}\n' for i in range(200))
    p = _w(tmp_path, "s.om", body)
    with pytest.raises(ParseError, match=r"more than 100 series.*FRAGSCOPE_MAX_SERIES"):
        read_recording(p, max_series=100)
    with pytest.raises(ParseError, match=r"50 points reached.*FRAGSCOPE_MAX_POINTS"):
        read_recording(p, max_points=50)
    monkeypatch.setenv("FRAGSCOPE_MAX_SERIES", "150")
    with pytest.raises(ParseError, match="more than 150 series"):
        read_recording(p)
    monkeypatch.setenv("FRAGSCOPE_MAX_SERIES", "200")
    assert len(read_recording(p)) == 200


def test_many_short_lived_series_all_read(tmp_path):
    """The short-lived-series reproducer, small: each series lives 2 points; every one is kept.
    (Time and memory per series: bench/bench_ingest.py --churn.)"""
    n = 5000
    body = "".join(f'vllm:num_requests_running{{model_name="m",req="{i}"}} 1 {1_700_000_000 + 15 * i}\n'
                   f'vllm:num_requests_running{{model_name="m",req="{i}"}} 2 {1_700_000_015 + 15 * i}\n'
                   for i in range(n))
    w = read_recording(_w(tmp_path, "churn.om", body + "# EOF\n"))
    assert len(w) == n and w.end - w.start == 15 * n
    assert sum(len(s) for s in w) == 2 * n


def test_overlong_line_is_not_read_whole(tmp_path):
    long = 'g{a="' + "x" * (3 << 20) + '"} 1 1700000000\n'
    good = "".join(f"g {i} {1_700_000_000 + 15 * i}\n" for i in range(100))
    w = read_recording(_w(tmp_path, "long.om", good + long + "# EOF\n"))
    assert len(w.select("g")[0]) == 100 and any("unparsable" in n for n in w.notes)


# --- not regular files ------------------------------------------------------------------------------
def test_fifo_device_directory_refused_without_hanging(tmp_path):
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    for path, what in ((fifo, "FIFO"), ("/dev/zero", "character device"), (str(tmp_path), "directory")):
        with pytest.raises(ParseError, match=what):
            read_recording(path)
    r = real_cli(fifo, timeout=30)  # its own process: a reader that blocked on the FIFO must not hang the suite
    _one_line_error(r, "FIFO")


# --- files that are something else: say what, and which command reads them ----------------------------
def _snapshot_json():
    return json.dumps({"segments": [{"device": 0, "address": 0, "total_size": 2097152, "allocated_size": 0,
                                     "blocks": []}], "device_traces": [[]]})


@pytest.mark.parametrize("name,content,needle", [
    ("trace.json.gz", os.path.join(DATA, "trace", "hta_alexnet_critical_path.json.gz"), "diagnose trace"),
    ("trace2.json.gz", os.path.join(DATA, "trace", "hta_timeline_sampled_rank0.json.gz"), "diagnose trace"),
    ("chrome.json", json.dumps([{"name": "k", "ph": "X", "ts": 1, "dur": 2, "pid": 0, "tid": 0}]), "diagnose trace"),
    ("snap.pickle", os.path.join(DATA, "snapshot", "fragmented_oom.pickle"), "diagnose snapshot"),
    ("snap.json", _snapshot_json(), "diagnose snapshot"),
    ("out.json", json.dumps({"window": {"start": 1, "end": 2}, "source": "x", "findings": [],
                             "inconclusive": [], "signals": {}}, indent=2), "fragscope's own JSON output"),
    ("api.json", json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}),
     "Prometheus HTTP API response"),
    ("config.json", json.dumps({"model": "llama", "tensor_parallel_size": 2}), "a JSON document"),
    ("v0.log", os.path.join(DATA, "logs", "vllm_v0_preemption_storm.log"), "diagnose logs"),
    ("v1.log", os.path.join(DATA, "logs", "vllm_v1_oom.log"), "diagnose logs"),
    ("sg.log", os.path.join(DATA, "logs", "sglang_retractions.log"), "diagnose logs"),
    ("zip.bin", b"PK\x03\x04" + b"\x00" * 100, "zip archive"),
])
def test_wrong_kind_of_file_names_the_command(tmp_path, name, content, needle):
    if isinstance(content, str) and os.path.exists(content):
        with open(content, "rb") as fh:
            content = fh.read()
    p = _w(tmp_path, name, content)
    with pytest.raises(ParseError) as e:
        read_recording(p)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and p in msg and "unbalanced braces" not in msg, msg


def test_sqlite_export_names_diagnose_trace(tmp_path):
    p = str(tmp_path / "report.sqlite")
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.commit()
    con.close()
    with pytest.raises(ParseError, match="SQLite database.*diagnose trace"):
        read_recording(p)


def test_cli_other_kind_is_read_by_its_own_command(tmp_path):
    """`diagnose FILE` given a log, a trace or a snapshot answers as `diagnose logs|trace|snapshot FILE`
    would (same stdout and exit code), with one note on stderr naming the command; its input errors stay
    one line; options only metrics recordings have are refused."""
    for sub, name in (("logs", os.path.join(DATA, "logs", "vllm_v1_oom.log")),
                      ("trace", os.path.join(DATA, "trace", "hta_alexnet_critical_path.json.gz")),
                      ("snapshot", os.path.join(DATA, "snapshot", "fragmented_oom.pickle"))):
        direct, routed = cli(sub, name, "--format", "json"), cli(name, "--format", "json")
        assert routed.returncode == direct.returncode and routed.stdout == direct.stdout, sub
        assert routed.stderr.strip().splitlines() == [line for line in direct.stderr.strip().splitlines()] + [
            f"diagnose: {name}: {routed.stderr.split(name + ': ', 1)[1].split(';', 1)[0]}; read as: diagnose {sub} {name}"]
    p = _w(tmp_path, "trace.json", json.dumps({"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 1}]}))
    _one_line_error(cli(p), "no GPU activity", p)  # the trace reader's own error, alone
    _one_line_error(cli(os.path.join(DATA, "logs", "vllm_v1_oom.log"), "--since", "5m"), "diagnose logs",
                    "--since applies to metrics recordings")


def test_cli_single_scrape_end_to_end(tmp_path):
    """A real single scrape through the console script: exit 0/1, valid JSON without NaN tokens, the
    scrape note in signals.notes."""
    src = os.path.join(DATA, "collectors", "vllm_cpu_0.32.0_tiny_after_preemption.metrics.txt")
    r = cli(src, "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    d = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert any("one scrape without timestamps" in n for n in d["signals"]["notes"])
    assert d["window"]["start"] == d["window"]["end"] and math.isfinite(d["window"]["start"])


def test_bulk_window_equals_from_columns():
    """The reader's bulk window builder against the model's per-series one, on clean, unsorted,
    duplicate, NaN/Inf and empty series (lists and arrays)."""
    import numpy as np

    from fragscope.collectors.scrapes import bulk_window
    from fragscope.model import SeriesKey, Window

    rng = np.random.default_rng(7)
    cols = {}
    for i in range(300):
        n = int(rng.integers(0, 6))
        ts = (1_700_000_000 + rng.choice(np.arange(20), size=n, replace=bool(i % 3 == 0)) * 15.0)
        if i % 2:
            ts = np.sort(ts)
        vs = rng.normal(size=n)
        if n and i % 5 == 0:
            vs[0] = [np.nan, np.inf, -np.inf][i % 3]
        cols[SeriesKey("m", (("i", str(i)),))] = (ts.tolist(), vs.tolist())
    types = {"m": "gauge"}
    for c in (cols, {k: (np.asarray(a), np.asarray(b)) for k, (a, b) in cols.items()}):
        a, b = bulk_window(c, "src", types), Window.from_columns(c, source="src", types=types)
        assert (a.start, a.end, a.dropped_points, list(a.series)) == (b.start, b.end, b.dropped_points, list(b.series))
        assert a.dropped_points > 0
        for k in a.series:
            assert a.series[k].ts.tolist() == b.series[k].ts.tolist()
            assert a.series[k].values.tolist() == b.series[k].values.tolist()
            assert a.series[k].type == "gauge"
    empty = bulk_window({SeriesKey("x"): ([], [])})
    assert len(empty) == 0 and math.isnan(empty.start)


def test_gzip_ratio_stops_a_bomb_early_and_real_files_pass(tmp_path, monkeypatch):
    from fragscope.collectors import inputs

    monkeypatch.setattr(inputs, "GZIP_RATIO_AFTER", 256 << 10)
    bomb = _w(tmp_path, "b.om.gz", gzip.compress(b"g 1 1700000000\n" + b"\n" * (4 << 20), 9))
    with pytest.raises(ParseError, match=r"more than 200 times its compressed size.*FRAGSCOPE_MAX_GZIP_RATIO"):
        read_recording(bomb)
    monkeypatch.setenv("FRAGSCOPE_MAX_GZIP_RATIO", "100000")
    with pytest.raises(ParseError, match="lines in a row without a sample|no samples|not metrics"):
        read_recording(bomb)  # past the ratio, the newline guard or the parse still refuses it
    monkeypatch.delenv("FRAGSCOPE_MAX_GZIP_RATIO")
    src = os.path.join(DATA, "collectors", "vllm_v1_cncf_kops.metrics.txt")
    with open(src, "rb") as fh:
        body = fh.read()
    real = _w(tmp_path, "loop.txt.gz", gzip.compress(body * 40, 9))  # 2.1 MB of scrapes, ratio ~11
    w = read_recording(real, 10.0, scrape_time=T)
    assert w.scrapes == 40


def test_headers_without_samples_say_so(tmp_path):
    """A scrape of # HELP / # TYPE lines only (a server before its first request: labelled metrics have
    no child yet) is named for what it is, not 'comments only'."""
    p = _w(tmp_path, "hdr.txt", "# HELP vllm:num_preemptions_total Preemptions\n"
                                "# TYPE vllm:num_preemptions_total counter\n")
    with pytest.raises(ParseError, match="metric families declared .* but no sample lines"):
        read_recording(p)
    with pytest.raises(ParseError, match=r"no samples \(empty or comments only\)"):
        read_recording(_w(tmp_path, "c.txt", "# a comment\n"))
