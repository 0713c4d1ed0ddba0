"""Hostile and broken trace files (issue 12): each gives one line on stderr and exit 2, or (for fields a
reader can do without) valid output -- never a traceback, a hang or NaN in the JSON. Small reproducers."""
from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fragscope.cli import diagnose_group
from fragscope.collectors.nsys import read_nsys
from fragscope.timeline_model import TraceError

DATA = Path(__file__).parent / "data" / "trace"
HAVE_CX = __import__("importlib").util.find_spec("connectorx") is not None
READERS = ["stdlib", "pages"] + (["connectorx"] if HAVE_CX else [])


def _run(*args: str):
    return CliRunner().invoke(diagnose_group, ["trace", *args])


def _bad(path: Path, needle: str, *extra: str) -> str:
    r = _run(str(path), *extra)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert needle in lines[0], lines[0]
    return lines[0]


def _ok_json(path: Path) -> dict:
    r = _run(str(path), "--format", "json", "--fail-on", "never")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)  # (json.loads accepts NaN: check the text too)


def _trace(n: int = 12, **over) -> dict:
    ev = []
    for i in range(n):
        t = 1000.0 + i * 50
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t,
                   "dur": 5.0, "args": {"correlation": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t + 6, "dur": 2.0,
                   "args": {"correlation": i + 1, "device": 0, "stream": 7}})
    doc = {"traceEvents": ev}
    doc.update(over)
    return doc


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# --------------------------------------------------------------------------------------------
# Kineto: fields of the wrong type are read around (the event's other fields still count)
@pytest.mark.parametrize("patch", [
    {"name": 12}, {"name": ["a"]}, {"args": [1, 2]}, {"args": "x"}, {"cat": ["kernel"]}, {"pid": [1]},
    {"tid": {"a": 1}},
])
def test_wrong_typed_fields_do_not_crash(tmp_path, patch):
    doc = _trace()
    for e in doc["traceEvents"][:6]:
        e.update(patch)
    doc["traceEvents"].append({"ph": "s", "cat": "ac2g", "id": [1, 2], "pid": 1, "tid": 1, "ts": 1})
    doc["traceEvents"].append({"ph": "f", "cat": "ac2g", "id": {"x": 1}, "pid": [0], "tid": 7, "ts": 1})
    doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": {"ProfilerStep#": 1}, "ts": 1, "dur": 1})
    p = _write(tmp_path, "t.json", json.dumps(doc))
    out = _ok_json(p)
    assert out["selection"]["ops_total"] >= 9  # at most the 3 patched kernels are lost (no category)
    assert "NaN" not in _run(str(p), "--format", "json", "--fail-on", "never").output


def test_wrong_typed_metadata(tmp_path):
    p = _write(tmp_path, "m.json", json.dumps(_trace(distributedInfo=[1], schemaVersion={"a": 1},
                                                     baseTimeNanoseconds="x", traceName=[1])))
    out = _ok_json(p)
    assert "schema_version" not in out


@pytest.mark.parametrize("text,needle", [
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": NaN, "dur": 1, "args": {}}]}', "NaN"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": Infinity, "args": {}}]}', "Infinity"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1, "args": {"device": -Infinity}}]}',
     "Infinity"),
])
def test_nan_and_infinity_refused(tmp_path, text, needle):
    line = _bad(_write(tmp_path, "n.json", text), "not valid JSON")
    assert needle in line


@pytest.mark.parametrize("field,value", [("correlation", 2 ** 64), ("device", -(2 ** 70)), ("stream", 10 ** 30)])
def test_ids_beyond_64_bits_refused(tmp_path, field, value):
    doc = _trace()
    doc["traceEvents"][1]["args"][field] = value
    _bad(_write(tmp_path, "b.json", json.dumps(doc)), "out of the 64-bit range")


@pytest.mark.parametrize("ts", ["100000000000000000000000000000", "1e300", "-1e30", "4.7e15"])
def test_times_out_of_range_refused(tmp_path, ts):
    text = json.dumps(_trace()).replace('"ts": 1006.0', f'"ts": {ts}', 1)
    assert ts in text
    _bad(_write(tmp_path, "ts.json", text), "out of range")


def test_huge_integer_text_refused(tmp_path):
    text = json.dumps(_trace()).replace('"ts": 1006.0', '"ts": ' + "9" * 5000, 1)
    _bad(_write(tmp_path, "digits.json", text), "not valid JSON")


def test_deep_nesting_refused(tmp_path):
    depth = 200_000
    p = _write(tmp_path, "deep.json", '{"traceEvents": [' + "[" * depth + "]" * depth + "]}")
    _bad(p, "nested too deeply")


def test_gzip_bomb_capped(tmp_path):
    body = json.dumps(_trace()).encode()
    pad = b" " * (3 << 20)  # 3 MiB of whitespace: valid JSON, 3 KiB compressed
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(body[:-1] + pad + body[-1:]))
    assert p.stat().st_size < 20_000
    line = _bad(p, "gzip unpacks to more than the 1,000,000-byte cap", "--max-json-bytes", "1000000")
    assert "--max-json-bytes" in line
    assert _run(str(p), "--max-json-bytes", str(8 << 20), "--fail-on", "never").exit_code == 0  # raised: read


def test_plain_json_over_cap(tmp_path):
    p = _write(tmp_path, "big.json", json.dumps(_trace()) + " " * 5000)
    _bad(p, "above the 1,000-byte cap", "--max-json-bytes", "1000")


def test_multi_member_gzip_and_trailing_garbage(tmp_path):
    body = json.dumps(_trace()).encode()
    p = tmp_path / "multi.json.gz"
    p.write_bytes(gzip.compress(body[:100]) + gzip.compress(body[100:]))
    assert _ok_json(p)["selection"]["ops_total"] == 12
    p.write_bytes(gzip.compress(body) + b"garbage")
    _bad(p, "trailing garbage")
    p.write_bytes(gzip.compress(body)[:-12])
    _bad(p, "truncated or corrupt gzip")


def test_directory_and_missing(tmp_path):
    _bad(tmp_path / "nope.json", "No such file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_refused_without_hanging(tmp_path):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, "-c", "from fragscope.cli import diagnose_main; diagnose_main()", "trace",
                        str(fifo)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "not a regular file" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------
# nsys SQLite
def _nsys(path: Path, rows=((1_000, 2_000), (3_000, 4_000)), epoch=1_700_000_000_000_000_000) -> Path:
    c = sqlite3.connect(path)
    c.executescript((DATA / "nsys_schema.sql").read_text())
    c.execute("INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel_v7000')")
    c.execute("INSERT INTO StringIds VALUES (7, 'gemm')")
    c.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (epoch,))
    for i, (s, e) in enumerate(rows):
        c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
                  "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, "
                  "blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
                  "VALUES (?,?,0,1,7,?,?,7,7,32,1,1,1,1,1,1,0,0,0,0,0)", (s, e, i + 1, 1 << 24))
    c.commit()
    c.close()
    return path


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("column,value", [("start", "abc"), ("end", 1.5), ("deviceId", "gpu0"),
                                          ("streamId", 2.5), ("correlationId", "x")])
def test_nsys_non_integer_column_refused(tmp_path, monkeypatch, reader, column, value):
    p = _nsys(tmp_path / "t.sqlite")
    c = sqlite3.connect(p)
    c.execute(f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET {column} = ? WHERE rowid = 2", (value,))
    c.commit()
    c.close()
    monkeypatch.setenv("FRAGSCOPE_SQLITE_READER", reader)
    _bad(p, "not integers")


def test_nsys_text_epoch_refused(tmp_path):
    p = _nsys(tmp_path / "e.sqlite", epoch="yesterday")
    _bad(p, "utcEpochNs is not an integer")


def test_nsys_invalid_utf8_text_refused(tmp_path):
    p = _nsys(tmp_path / "u.sqlite")
    c = sqlite3.connect(p)
    c.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_PRODUCT_VERSION', CAST(X'fffe80' AS TEXT))")
    c.commit()
    c.close()
    _bad(p, "not UTF-8")


def test_nsys_corrupted_page_refused(tmp_path):
    p = _nsys(tmp_path / "c.sqlite", rows=[(i * 1000, i * 1000 + 500) for i in range(3000)])
    raw = bytearray(p.read_bytes())
    page = 4096
    for off in range(page * 3, len(raw) - page, page * 2):  # b-tree pages of the tables: garbage
        raw[off:off + 64] = b"\xff" * 64
    p.write_bytes(bytes(raw))
    r = _run(str(p))
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("reader", READERS)
def test_nsys_sparse_rowids_read_in_one_step(tmp_path, monkeypatch, reader):
    """rowids 1 and 2**63 - 1: the stdlib reader once looped over 2**63 / 2e6 rowid ranges."""
    import fragscope.collectors.sqlite_columns as nsys  # (the column readers behind read_nsys)

    p = _nsys(tmp_path / "r.sqlite", rows=[])
    c = sqlite3.connect(p)
    for rowid, s in ((1, 1_000), (2 ** 63 - 1, 5_000)):
        c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (rowid, start, end, deviceId, contextId, streamId, "
                  "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, "
                  "blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
                  "VALUES (?,?,?,0,1,7,16777216,7,7,32,1,1,1,1,1,1,0,0,0,0,0)", (rowid, s, s + 500))
    c.commit()
    c.close()
    monkeypatch.setattr(nsys, "_cx_parts", lambda rows: 3)  # connectorx: three rowid ranges, the last open
    tl = read_nsys(str(p), reader=reader)
    assert tl.meta["reader"] == reader and tl.op_start.tolist() == [1_000, 5_000]


def test_nsys_recursive_view_named_like_a_cupti_table_refused(tmp_path):
    p = tmp_path / "v.sqlite"
    c = sqlite3.connect(p)
    c.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    c.execute("CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS WITH RECURSIVE r(start) AS (SELECT 0 UNION ALL "
              "SELECT start + 1 FROM r) SELECT start, start AS end, 0 AS deviceId, 0 AS streamId FROM r")
    c.commit()
    c.close()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, "-c", "from fragscope.cli import diagnose_main; diagnose_main()", "trace",
                        str(p)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "is a view, not a table" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_nsys_query_deadline(tmp_path, monkeypatch):
    """Defence in depth: a statement past the deadline is stopped (progress handler), one line, exit 2."""
    import fragscope.collectors.sqlite_columns as nsys  # (the column readers behind read_nsys)

    monkeypatch.setattr(nsys, "QUERY_TIMEOUT_S", -1.0)
    monkeypatch.setattr(nsys, "_PROGRESS_OPS", 1)
    with pytest.raises(TraceError, match="FRAGSCOPE_SQLITE_TIMEOUT_S"):
        read_nsys(str(_nsys(tmp_path / "d.sqlite")), reader="stdlib")


def test_not_sqlite_nor_json(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"\x00\x01binary")
    _bad(p, "not a trace")
