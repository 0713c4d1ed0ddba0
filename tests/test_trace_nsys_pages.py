"""The nsys b-tree page reader (fragscope.collectors.nsys_pages) against SQLite's own answers: every integer
width and sign, NULLs, text, blobs and REALs in the columns before the wanted ones, page sizes, deep trees,
sparse rowids, a row filter; and every layout it does not decode handed back (Unsupported) so that SQL reads
the table instead."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from fragscope.collectors import nsys_pages
from fragscope.collectors.nsys import read_nsys
from fragscope.collectors.nsys_pages import Column, Unsupported, read_table

DATA = Path(__file__).parent / "data" / "trace"
# every serial type of an integer: 0 and 1 (types 8, 9), 1-8 bytes, both signs, the extremes
EDGES = [0, 1, -1, 127, -128, 128, 32767, -32768, 32768, 2 ** 23 - 1, -2 ** 23, 2 ** 23, 2 ** 31 - 1, -2 ** 31,
         2 ** 31, 2 ** 47 - 1, -2 ** 47, 2 ** 47, 2 ** 63 - 1, -2 ** 63]


def _db(path: Path, rows: list[tuple], page_size: int = 4096,
        schema: str = "t TEXT, b BLOB, r REAL, x INTEGER, y INTEGER, k INTEGER", options: str = "") -> Path:
    c = sqlite3.connect(path)
    c.execute(f"PRAGMA page_size = {page_size}")
    c.execute(f"CREATE TABLE T ({schema}){options}")
    if rows:
        c.executemany(f"INSERT INTO T VALUES ({', '.join('?' * len(rows[0]))})", rows)
    c.commit()
    c.close()
    return path


def _sql(path: Path, cols: list[str], where: str = "") -> list[np.ndarray]:
    c = sqlite3.connect(path)
    rows = c.execute(f"SELECT {', '.join(cols)} FROM T {where} ORDER BY rowid").fetchall()
    c.close()
    return [np.array([r[i] for r in rows], dtype=np.int64) for i in range(len(cols))]


def _pages(path: Path, cols: list[Column], keep=None) -> list[np.ndarray]:
    c = sqlite3.connect(path)
    try:
        return read_table(c, str(path), "T", cols, keep)
    finally:
        c.close()


def _rows(n: int, seed: int = 1) -> list[tuple]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = None if i % 7 == 0 else "x" * int(rng.integers(0, 300))  # 1- and 2-byte serial types
        b = None if i % 5 == 0 else bytes(int(rng.integers(0, 90)))
        r = None if i % 3 == 0 else float(rng.normal())
        x = EDGES[i % len(EDGES)]
        y = int(rng.integers(-2 ** 40, 2 ** 40)) >> int(rng.integers(0, 41))
        out.append((t, b, r, x, y, i % 4))
    return out


@pytest.mark.parametrize("page_size", [512, 4096, 65536])
@pytest.mark.parametrize("block", [7, 1 << 16])
def test_every_integer_width_and_sign(tmp_path, monkeypatch, page_size, block):
    monkeypatch.setattr(nsys_pages, "BLOCK_CELLS", block)
    p = _db(tmp_path / "t.sqlite", _rows(3000), page_size=page_size)
    x, y, k = _pages(p, [Column("x"), Column("y"), Column("k")])
    rx, ry, rk = _sql(p, ["x", "y", "k"])
    assert x.tolist() == rx.tolist() and y.tolist() == ry.tolist() and k.tolist() == rk.tolist()
    assert set(EDGES) <= set(x.tolist())
    # a field of bytes kept in place (as the PID in nsys's global ids, bits 24-47): values of every width
    f = [(3, 3), (0, 1), (1, 2), (2, 5)]
    got = _pages(p, [Column(c, 0, field=fl) for c in ("x", "y") for fl in f])
    ref = _sql(p, [f"{c} & {((1 << (8 * n)) - 1) << (8 * lo)}" for c in ("x", "y") for lo, n in f])
    for g, r in zip(got, ref):
        assert g.tolist() == r.tolist()


def test_nulls_constants_tests_and_filter(tmp_path):
    rows = _rows(2000)
    rows = [(t, b, r, None if i % 11 == 0 else x, y, None if i % 13 == 0 else k)
            for i, (t, b, r, x, y, k) in enumerate(rows)]
    p = _db(tmp_path / "n.sqlite", rows)
    got = _pages(p, [Column("x", -1), Column(None, 5), Column("k", 0, [2, 3]), Column("k", 0, [1], also=("x",)),
                     Column("y")], keep=("k", [1, 2]))
    ref = _sql(p, ["ifnull(x, -1)", "5", "ifnull(k IN (2, 3), 0)", "ifnull(k = 1 OR x = 1, 0)", "y"],
               "WHERE k IN (1, 2)")
    for g, r in zip(got, ref):
        assert g.tolist() == r.tolist()
    assert (got[0] == -1).any() and got[2].any() and not got[2].all()


def test_deep_tree_and_sparse_rowids(tmp_path):
    p = _db(tmp_path / "d.sqlite", [], page_size=512, schema="x INTEGER, pad BLOB")
    c = sqlite3.connect(p)
    rng = np.random.default_rng(3)
    ids = np.unique(rng.integers(1, 2 ** 63 - 1, 20000, dtype=np.int64)).tolist() + [2 ** 63 - 1]
    c.executemany("INSERT INTO T (rowid, x, pad) VALUES (?, ?, ?)", [(r, r // 3, bytes(40)) for r in ids])
    c.commit()
    c.close()
    (x,) = _pages(p, [Column("x")])
    assert x.tolist() == [r // 3 for r in ids]  # rowid order, 9-byte rowid varints included


def test_real_exports_schema_through_read_nsys(tmp_path, monkeypatch):
    """The default reader on an export with the real schema; the same Timeline as the SQL reader."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_trace import make_nsys_mixed

    p = make_nsys_mixed(tmp_path / "m.sqlite", n=4000, seed=11)
    monkeypatch.setattr(nsys_pages, "BLOCK_CELLS", 301)
    a, b = read_nsys(str(p), reader="stdlib"), read_nsys(str(p))
    assert b.meta["reader"] == "pages" and a.meta["reader"] == "stdlib"
    for f in ("op_start", "op_end", "op_device", "op_stream", "op_pid", "op_kind", "op_bytes", "op_copy_kind",
              "op_pageable", "op_launch", "op_comm", "call_start", "call_end", "call_kind", "call_name"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


def _unsupported(p: Path, cols: list[Column]) -> str:
    with pytest.raises(Unsupported) as e:
        _pages(p, cols)
    return str(e.value)


def test_layouts_left_to_sql(tmp_path):
    rows = [(None, None, None, 1, 2, 3)] * 10
    # a REAL or text value in a wanted column: SQL reads it and says what is wrong
    p = _db(tmp_path / "r.sqlite", rows[:5] + [(None, None, None, 1.5, 2, 3)])
    assert "not an integer" in _unsupported(p, [Column("x")])
    p = _db(tmp_path / "s.sqlite", rows[:5] + [(None, None, None, "abc", 2, 3)])
    assert "not an integer" in _unsupported(p, [Column("x")])
    # a column declared otherwise than INTEGER (a REAL column would hand back 2.0, not 2)
    assert "column r" in _unsupported(_db(tmp_path / "t.sqlite", rows), [Column("r")])
    # the rowid itself, a WITHOUT ROWID table, a generated column
    p = _db(tmp_path / "pk.sqlite", [(i, i) for i in range(5)], schema="id INTEGER PRIMARY KEY, x INTEGER")
    assert "column id" in _unsupported(p, [Column("id")])
    assert _pages(p, [Column("x")])[0].tolist() == list(range(5))  # (stored as NULL before x: read past)
    p = _db(tmp_path / "wr.sqlite", [(i, i) for i in range(5)], schema="id INTEGER PRIMARY KEY, x INTEGER",
            options=" WITHOUT ROWID")
    assert "b-tree" in _unsupported(p, [Column("x")])
    p = _db(tmp_path / "g.sqlite", [(1,)], schema="x INTEGER, g INTEGER GENERATED ALWAYS AS (x + 1)")
    assert "generated" in _unsupported(p, [Column("x")])
    # rows spilling to overflow pages; rows older than an added column
    p = _db(tmp_path / "o.sqlite", [("x" * 5000, None, None, 1, 2, 3)])
    assert "overflow" in _unsupported(p, [Column("x")])
    p = _db(tmp_path / "a.sqlite", rows)
    c = sqlite3.connect(p)
    c.execute("ALTER TABLE T ADD COLUMN z INTEGER")
    c.commit()
    c.close()
    assert "fewer columns" in _unsupported(p, [Column("z")])
    # a WAL database, a journal beside the file
    p = _db(tmp_path / "w.sqlite", rows)
    c = sqlite3.connect(p)
    c.execute("PRAGMA journal_mode = WAL")
    c.close()
    assert _unsupported(p, [Column("x")])
    p = _db(tmp_path / "j.sqlite", rows)
    Path(str(p) + "-journal").write_bytes(b"")
    assert "journal" in _unsupported(p, [Column("x")])


def test_broken_pages_left_to_sql(tmp_path):
    p = _db(tmp_path / "b.sqlite", _rows(3000))
    raw = bytearray(p.read_bytes())
    for off in range(4096 * 3, len(raw) - 4096, 4096 * 2):
        raw[off:off + 64] = b"\xff" * 64
    p.write_bytes(bytes(raw))
    _unsupported(p, [Column("x")])
    # truncated: the tree points past the file's end
    p = _db(tmp_path / "t.sqlite", _rows(3000))
    p.write_bytes(p.read_bytes()[: 4096 * 20])
    _unsupported(p, [Column("x")])


def test_mutated_exports_read_as_sql_reads_them(tmp_path):
    """Bytes of an export's pages changed at random (seeded): the default reader gives the SQL reader's
    Timeline, or the same one-line error (a differential check; a longer run of this: docs/trace.md)."""
    import random
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_trace import make_nsys

    from fragscope.timeline_model import TraceError

    seed = make_nsys(tmp_path / "seed.sqlite", procs=(5,), n=40).read_bytes()
    r = random.Random(5)
    fields = ("op_start", "op_end", "op_device", "op_stream", "op_pid", "op_kind", "op_bytes", "op_launch",
              "op_comm", "call_start", "call_end", "call_kind", "call_name")
    p = tmp_path / "m.sqlite"
    read_by_pages = 0
    for _ in range(60):
        raw = bytearray(seed)
        for _ in range(r.randint(1, 3)):
            raw[r.randrange(4096, len(raw))] = r.randrange(256)
        p.write_bytes(bytes(raw))
        out = []
        for reader in ("auto", "stdlib"):
            try:
                out.append(read_nsys(str(p), reader=reader))
            except TraceError as e:
                out.append(str(e))
        a, b = out
        assert type(a) is type(b), (a, b)
        if isinstance(a, str):
            assert a == b
            continue
        read_by_pages += a.meta["reader"] == "pages"
        for f in fields:
            assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert read_by_pages >= 5  # (most changes leave a readable file: the page reader read them)


def test_a_file_that_cannot_be_mapped_is_read_by_sql(tmp_path, monkeypatch):
    import mmap
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_trace import make_nsys

    p = make_nsys(tmp_path / "r.sqlite", procs=(5,))
    ref = read_nsys(str(p), reader="stdlib")

    def no_map(*a, **k):
        raise OSError(19, "No such device")

    monkeypatch.setattr(mmap, "mmap", no_map)
    tl = read_nsys(str(p))
    assert tl.meta["reader"] == "stdlib" and np.array_equal(tl.op_start, ref.op_start)


def _wide_rows(n: int, seed: int) -> list[tuple]:
    """Rows whose layouts repeat in runs (as an export's: the same widths row after row) and sometimes
    change: integers of every width and sign, NULLs, 0 and 1 (no bytes), short and long blobs before the
    wanted columns (payloads of 128 bytes and more: 2-byte length varints)."""
    rng = np.random.default_rng(seed)
    out = []
    run = None
    for i in range(n):
        if run is None or rng.random() < 0.01:
            run = (int(rng.integers(0, len(EDGES))), int(rng.integers(0, 140)), rng.random() < 0.3)
        x = EDGES[run[0]] if rng.random() < 0.9 else EDGES[int(rng.integers(0, len(EDGES)))]
        pad = None if run[2] else bytes(run[1])
        y = None if i % 17 == 0 else int(rng.integers(-2 ** 62, 2 ** 62)) >> (run[0] * 3)
        out.append((pad, i % 3, x, y, 7 + i % 4, 2 ** 48 + (i << 24) if run[2] else i))
    return out


@pytest.mark.parametrize("page_size", [512, 4096])
def test_row_decode_reads_what_the_byte_decode_reads(tmp_path, monkeypatch, page_size):
    """The row decode (fixed positions per layout) against the byte-at-a-time decode and SQLite, on rows
    whose layouts run and change, rowids of 1 to 9 bytes, more layouts in a block than it takes, a wanted
    column past the first bytes gathered (the row width grown) and past what it ever gathers."""
    p = _db(tmp_path / "w.sqlite", [], page_size=page_size,
            schema="pad BLOB, c INTEGER, x INTEGER, y INTEGER, s INTEGER, g INTEGER, "
                   "i1 INTEGER, i2 INTEGER, i3 INTEGER, i4 INTEGER, far INTEGER")
    rows = _wide_rows(6000, seed=page_size)
    rng = np.random.default_rng(2)
    ids = np.unique(np.concatenate([np.arange(1, 3000), rng.integers(3000, 2 ** 63 - 1, 3000, dtype=np.int64)]))
    big = 2 ** 62
    c = sqlite3.connect(p)
    c.executemany("INSERT INTO T (rowid, pad, c, x, y, s, g, i1, i2, i3, i4, far) VALUES "
                  "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  [(int(r), *row, *([big] * 4 if j % 500 < 250 else [1] * 4), j)
                   for j, (r, row) in enumerate(zip(ids.tolist(), rows))])
    c.commit()
    c.close()
    cols = [Column("x", -1), Column("y", -5), Column("s"), Column("g", 0, field=(3, 3)), Column("c", 0, [1]),
            Column("far")]
    ref = _sql(p, ["ifnull(x, -1)", "ifnull(y, -5)", "s", f"g & {0xFFFFFF << 24}", "ifnull(c = 1, 0)", "far"])
    by_bytes = []
    real_cells = nsys_pages._cells

    def cells(buf, cell, *a):
        by_bytes.append(cell.size)
        return real_cells(buf, cell, *a)

    monkeypatch.setattr(nsys_pages, "_cells", cells)
    for block, width, most in ((7, 64, 256), (1 << 16, 48, 256), (1 << 16, 64, 64)):
        monkeypatch.setattr(nsys_pages, "BLOCK_CELLS", block)
        monkeypatch.setattr(nsys_pages, "ROW_BYTES", width)  # 48: grown at the first block
        monkeypatch.setattr(nsys_pages, "_MAX_ROW_BYTES", most)  # 64: "far" past it, those rows by bytes
        got = {}
        for mode in (False, True):
            monkeypatch.setattr(nsys_pages, "ROW_DECODE", mode)
            got[mode] = _pages(p, cols)
            got[(mode, "near")] = _pages(p, cols[:4], keep=("s", [7, 9]))
        for a, b, r in zip(got[False], got[True], ref):
            assert a.tolist() == b.tolist() == r.tolist()
        for a, b in zip(got[(False, "near")], got[(True, "near")]):
            assert a.tolist() == b.tolist()
        assert got[(True, "near")][2].tolist() == [v for v in ref[2].tolist() if v in (7, 9)]
    # (the byte decode read all rows when the row decode was off, and some of them when it was on: rows of a
    # block's ninth layout and later, long blobs' 2-byte serial types, 'far' past 64 bytes)
    assert 0 < min(by_bytes) and max(by_bytes) < 6000


def test_row_decode_checks_each_row_as_the_byte_decode(tmp_path, monkeypatch):
    """A row the byte decode refuses (a REAL among the wanted values, a row longer than its payload) is
    refused by the row decode too, in a block whose other rows share one layout."""
    rows = [(None, 1, 2, 3, 4, 5, 6)] * 500
    for bad in ((None, 1, 2.5, 3, 4, 5, 6), (None, 1, "zz", 3, 4, 5, 6)):
        p = _db(tmp_path / f"b{len(str(bad))}.sqlite", rows[:300] + [bad] + rows[300:],
                schema="pad BLOB, c INTEGER, x INTEGER, y INTEGER, s INTEGER, g INTEGER, h INTEGER")
        for mode in (False, True):
            monkeypatch.setattr(nsys_pages, "ROW_DECODE", mode)
            assert "not an integer" in _unsupported(p, [Column("x"), Column("s")])
    # a payload length cut short under one row's values: the same refusal either way
    p = _db(tmp_path / "p.sqlite", rows, schema="pad BLOB, c INTEGER, x INTEGER, y INTEGER, s INTEGER, g INTEGER, "
                                                "h INTEGER")
    raw = bytearray(p.read_bytes())
    leaf = next(off for off in range(4096, len(raw), 4096) if raw[off] == 0x0D)  # the first table leaf page
    ptr = int.from_bytes(raw[leaf + 16:leaf + 18], "big")  # its fifth row
    raw[leaf + ptr] = 3  # that row's payload: 3 bytes, shorter than its header and values
    p.write_bytes(bytes(raw))
    msgs = []
    for mode in (False, True):
        monkeypatch.setattr(nsys_pages, "ROW_DECODE", mode)
        msgs.append(_unsupported(p, [Column("x"), Column("s")]))
    assert msgs[0] == msgs[1] == "row longer than its payload"
