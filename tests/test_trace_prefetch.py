"""trace_io.prefetch_json_bytes: a gzip trace inflated in a thread while `diagnose trace` loads its modules. The
read that follows gives what reading the file gives, or reads it itself (a file changed meanwhile, not gzip,
an error: the same bytes or the same one-line error as without the prefetch)."""
from __future__ import annotations

import gzip
import os
import threading

import pytest

from fragscope.collectors import trace_io
from fragscope.timeline_model import TraceError


def test_prefetched_bytes_are_the_files(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": []}' * 1000))
    direct = trace_io.read_json_bytes(str(p))
    trace_io.prefetch_json_bytes(str(p))
    assert trace_io.read_json_bytes(str(p)) == direct
    assert (str(p), trace_io.DEFAULT_MAX_JSON_BYTES) not in trace_io._PREFETCHED  # (taken once)
    assert not [t for t in threading.enumerate() if t.name == "fragscope-gunzip"]


def test_a_file_changed_after_the_prefetch_is_read_again(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(b"[1]"))
    trace_io.prefetch_json_bytes(str(p))
    trace_io._PREFETCHED[(str(p), trace_io.DEFAULT_MAX_JSON_BYTES)][0].join()
    p.write_bytes(gzip.compress(b"[1, 2]"))
    os.utime(p, ns=(1, 1))  # (a new mtime even where the clock is coarse)
    assert trace_io.read_json_bytes(str(p)) == b"[1, 2]"


@pytest.mark.parametrize("content", [b"[1, 2, 3]", gzip.compress(b"[1]", mtime=0)[:12], b"\x1f\x8b" + b"\x00" * 30, b""],
                         ids=["plain-json", "truncated-gzip", "gzip-magic-only", "empty"])
def test_not_gzip_or_broken_reads_as_without(tmp_path, content):
    p = tmp_path / "t.json"
    p.write_bytes(content)

    def outcome():
        try:
            return trace_io.read_json_bytes(str(p))
        except TraceError as e:
            return f"error: {e}"

    direct = outcome()
    trace_io.prefetch_json_bytes(str(p))
    assert outcome() == direct


def test_another_cap_is_not_served_the_prefetch(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(b"[" + b"1, " * 100 + b"1]"))
    trace_io.prefetch_json_bytes(str(p))
    with pytest.raises(TraceError, match="cap"):
        trace_io.read_json_bytes(str(p), max_bytes=50)
    trace_io._PREFETCHED.pop((str(p), trace_io.DEFAULT_MAX_JSON_BYTES))[0].join()
