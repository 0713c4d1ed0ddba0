"""A Prometheus query result pasted as a markdown table (tests/data/collectors/pastes/SOURCES.md, vllm#24049): read
as samples, the separator row skipped, the reading noted; a pipe inside a label value is left alone."""
from __future__ import annotations

import os

from fragscope.collectors.exposition import read_recording
from fragscope.collectors.exposition_paste import table_row

PASTE = os.path.join(os.path.dirname(__file__), "data", "collectors", "pastes",
                     "vllm_pr24049_prometheus_ui_table.paste.txt")


def test_query_result_table_reads_every_engines_counter():
    # the paste's nine rows: drafts per data-parallel engine 0..7 = 22, 15, 29, 20, 25, 24, 27, 26 (188 in all)
    # and engine 0's _created timestamp 1756736798.733569; "<details>", "<summary>" and "-- | --" are not data
    w = read_recording(PASTE, scrape_time=1_800_000_000.0)
    drafts = {k.label("engine"): s.values.tolist() for k, s in w.series.items()
              if k.name == "vllm:spec_decode_num_drafts_total"}
    assert drafts == {"0": [22.0], "1": [15.0], "2": [29.0], "3": [20.0], "4": [25.0], "5": [24.0], "6": [27.0],
                      "7": [26.0]}
    assert sum(v[0] for v in drafts.values()) == 188
    assert len(w.series) == 9
    assert any("9 rows of a query result's table" in n for n in w.notes)


def test_table_row_only_splits_a_column_pipe():
    assert table_row('x{a="b", c="d"} | 3\n') == 'x{a="b", c="d"} 3\n'
    assert table_row("| up | 1 |\n") == "up 1\n"
    assert table_row("-- | --\n") is None and table_row("|---|---|\n") is None
    line = 'x{re="a|b"} 1\n'  # a pipe inside a label value: not a table
    assert table_row(line) is line
