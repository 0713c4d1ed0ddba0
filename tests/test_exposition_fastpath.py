"""The recording parser's fast path (known series, 'HEAD VALUE TIMESTAMP') against hand-checked values:
every line that needs more than the fast path (new series, unit conversion beyond milliseconds, bad
values, text after # EOF, caps) must come out exactly as the full parser reads it."""
from __future__ import annotations

import pytest

from fragscope.collectors.exposition import ParseError, read_recording
from fragscope.collectors.exposition_parse import parse_lines

T0 = 1_700_000_000


def _write(tmp_path, text: str) -> str:
    p = tmp_path / "rec.om"
    p.write_text(text)
    return str(p)


def _series(w, name):
    (s,) = w.select(name)
    return s.ts.tolist(), s.values.tolist()


def test_known_heads_with_spaces_braces_and_units(tmp_path):
    lines = [
        "# TYPE g gauge",
        f'g{{a="x y",b="}}"}} 1 {T0}',                  # first: full parser (label values with a space and a brace)
        f'g{{a="x y",b="}}"}} 2 {(T0 + 15) * 1000}',     # milliseconds: fast path converts
        f'g{{a="x y",b="}}"}}   3\t{T0 + 30}',           # runs of blanks between fields
        f'g{{a="x y",b="}}"}} 4 {(T0 + 45) * 1_000_000}',  # microseconds: full parser converts, notes it
        f"h 7 {T0}",
        f"h 8.5e0 {T0 + 15}",
        f"h NaN {T0 + 30}",                              # NaN dropped by the window, like the full parser
        "# EOF",
        f"h 99 {T0 + 45}",                               # after # EOF: ignored
    ]
    w = read_recording(_write(tmp_path, "\n".join(lines) + "\n"))
    assert _series(w, "g") == ([T0, T0 + 15, T0 + 30, T0 + 45], [1.0, 2.0, 3.0, 4.0])
    (g,) = w.select("g")
    assert dict(g.key.labels) == {"a": "x y", "b": "}"}
    assert _series(w, "h") == ([T0, T0 + 15], [7.0, 8.5])
    assert any("microseconds" in n for n in w.notes)


def test_bad_lines_of_known_series_are_counted_with_their_line_number():
    good = [f"g 1 {T0 + 15 * i}" for i in range(40)]
    lines = good[:20] + [f"g abc {T0 + 15 * 20}", f"g 2 -5", f"g 2 {T0 + 15 * 21} extra"] + good[21:]
    p = parse_lines(iter(lines), default_ts=None, source="x")
    assert p.samples == 40 and p.bad_lines == 2  # a third field (an exemplar's place) is allowed
    assert p.first_bad.startswith("line 21: could not convert string to float: 'abc'")
    assert any("2 unparsable lines skipped" in n for n in p.notes)
    (ts, vs), = p.cols.values()
    assert ts[20:22] == [T0 + 315, T0 + 315] and vs[20:22] == [2.0, 1.0]


def test_fast_path_agrees_with_the_full_parser_line_for_line():
    """Mode 3 (a default timestamp given) reads every line through the full parser; on text without paste
    debris and with every sample timestamped it must give what the recording mode (fast path) gives."""
    import random

    rng = random.Random(5)
    heads = ['a{x="1"}', 'a{x="2 3"}', 'b', 'c_bucket{le="0.5"}', 'c_bucket{le="+Inf"}', 'd{q="}"}', "e_total"]
    values, bad_values = ["1", "2.5", "-3", "NaN", "+Inf", "1e3", "1_0"], ["abc", "0x10", "}"]
    stamps = [str(T0 + rng.randrange(10_000)) for _ in range(5)] + [
        str((T0 + 7) * 1000), str((T0 + 9) * 10**6), str((T0 + 11) * 10**9)]
    bad_stamps = ["-1", "1e30", "x", "}"]
    lines = ["# TYPE c histogram", "# TYPE e counter"]
    for _ in range(3000):
        sep = rng.choice([" ", " ", " ", "  ", "\t"])
        v = rng.choice(bad_values if rng.random() < 0.02 else values)
        t = rng.choice(bad_stamps if rng.random() < 0.015 else stamps)
        lines.append(f"{rng.choice(heads)}{sep}{v}{sep}{t}")
    fast = parse_lines(iter(lines), default_ts=None, source="x")
    full = parse_lines(iter(lines), default_ts=1.0, source="x")
    assert fast.samples == full.samples > 1000 and fast.bad_lines == full.bad_lines > 30
    assert fast.first_bad == full.first_bad and fast.ts_units == full.ts_units == {"microseconds", "nanoseconds"}
    assert {k: repr((t, v)) for k, (t, v) in fast.cols.items()} == {k: repr((t, v)) for k, (t, v) in full.cols.items()}
    assert fast.openmetrics_ts == full.openmetrics_ts


def test_a_timestamp_text_read_once_says_seconds_only_for_a_line_read():
    """The fast path keeps each timestamp's text with its seconds; a line whose value is bad does not make the
    file's timestamps read as OpenMetrics seconds, whether its stamp text was seen before or not."""
    ms = str(T0 * 1000)
    lines = [f"g 1 {ms}", f"g 2 {ms}", f"g abc {T0}", f"g 3 {T0 * 1000 + 15_000}", f"g x {T0}"]
    lines += [f"g {i} {(T0 + 15 * i) * 1000}" for i in range(2, 60)]  # under the share of bad lines allowed
    fast = parse_lines(iter(lines), default_ts=None, source="x")
    full = parse_lines(iter(lines), default_ts=1.0, source="x")
    assert fast.openmetrics_ts is full.openmetrics_ts is False and fast.bad_lines == full.bad_lines == 2
    assert {k: repr(c) for k, c in fast.cols.items()} == {k: repr(c) for k, c in full.cols.items()}
    assert parse_lines(iter(lines + [f"g 4 {T0 + 30}"]), default_ts=None, source="x").openmetrics_ts is True


def test_dcgm_blank_sentinel_and_dropped_series_on_the_fast_path():
    lines = ["# TYPE c counter", f'DCGM_FI_DEV_GPU_UTIL{{gpu="0"}} 50 {T0}',
             f'DCGM_FI_DEV_GPU_UTIL{{gpu="0"}} 9223372036854775794 {T0 + 15}',  # blank: not available
             f'DCGM_FI_DEV_GPU_UTIL{{gpu="0"}} 60 {T0 + 30}',
             f"c_created 1 {T0}", f"c_created 1 {T0 + 15}", f"c_total 3 {T0}", f"c_total 4 {T0 + 15}"]
    p = parse_lines(iter(lines), default_ts=None, source="x")
    cols = {k.name: v for k, v in p.cols.items()}
    assert cols["DCGM_FI_DEV_GPU_UTIL"] == ([T0, T0 + 30], [50.0, 60.0])
    assert "c_created" not in cols  # a counter's _created companion is dropped, first line or later
    assert cols["c_total"] == ([T0, T0 + 15], [3.0, 4.0])
    assert p.samples == 4 and p.bad_lines == 0


def test_points_cap_on_the_fast_path(tmp_path):
    path = _write(tmp_path, "".join(f"g {i} {T0 + 15 * i}\n" for i in range(10)))
    with pytest.raises(ParseError, match=r"5 points reached \(line 5\)"):
        read_recording(path, max_points=5)
    assert len(read_recording(path, max_points=11).select("g")[0]) == 10
