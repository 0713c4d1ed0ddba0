"""Integer columns of an Nsight Systems export's large tables, decoded with numpy straight from the SQLite
file's table b-tree pages (the documented file format: https://www.sqlite.org/fileformat2.html).

Python's sqlite3 hands values over one Python object at a time, and the ``group_concat`` path spends most of
its time in SQLite's virtual machine (column decoding, then rendering every value as text that numpy parses
again): about 1.1 s of CPU per table of 2 M rows here. The b-tree's leaf pages hold the same values as
big-endian integers behind a small header per row; numpy reads them in blocks of leaf pages (1.5-2 orders of
magnitude fewer interpreter steps than rows), without text.

Only the plain layout an export has is decoded: a rowid table (no WITHOUT ROWID, no generated or hidden
column, the wanted columns declared INTEGER and none of them the rowid), rows that fit their page (no
overflow page), integer or NULL values in the wanted columns, no WAL or hot journal beside the file. Anything
else raises :class:`Unsupported` and the caller reads the table with SQL instead, which also keeps its
messages for hostile files (text or REAL values, broken pages). The read happens under a read transaction
of an SQLite connection (a SHARED lock: no writer can commit meanwhile). Pure numpy; no compiled code.
"""
from __future__ import annotations

import mmap
import os
import sqlite3

import numpy as np

from .safefile import NotRegularFile, open_regular_fd

BLOCK_CELLS = 1 << 16  # rows decoded per step: every temporary stays in the CPU's cache
_MAX_DEPTH = 40  # b-tree levels (a real table has 3-5)
# The row decode (_rows): each row's first ROW_BYTES bytes (grown up to _MAX_ROW_BYTES when a layout needs
# more) gathered in one step; rows whose layout (the lengths of their first varints, the header length and
# the serial types up to the last wanted column) is one of a block's first _MAX_LAYOUTS layouts are read at
# fixed positions; the others, and every row when ROW_DECODE is off, one byte at a time (_cells).
ROW_DECODE = True
ROW_BYTES = 64
_MAX_ROW_BYTES = 256
_MIN_ROW_BYTES = 48  # the varints (9 bytes each at most) and the layout's 16 bytes after them
_MAX_LAYOUTS = 8
# bytes of a value by serial type: 0-9 integers, NULL and REAL, 10 and 11 reserved, 12 and more blobs and text
# (-1: reserved), and by any one-byte serial type (0-127); _LUT_INT: -1 for all but NULL and the integers
_LUT = np.array([0, 1, 2, 3, 4, 6, 8, 8, 0, 0, -1, -1] + [(t - 12) >> 1 for t in range(12, 128)], dtype=np.int64)
_LUT_INT = np.array([0, 1, 2, 3, 4, 6, 8, -1, 0, 0] + [-1] * 118, dtype=np.int64)


class Unsupported(Exception):
    """A layout this reader does not decode; read the table with SQL instead."""


class Column:
    """One output column: ``name`` a column of the table (NULL -> ``null``), or ``name=None`` for the
    constant ``null``. With ``isin``: 1 where the column's value is one of these ids, else 0 (NULL: 0);
    ``also`` names more columns tested the same way (1 when any of them matches). With ``field=(lo, n)``
    only bytes lo .. lo + n - 1 of the value (counted from the least significant) are kept, in place:
    ``value & ((2 ** (8 * n) - 1) << (8 * lo))`` (NULL: ``null``), from fewer bytes gathered."""

    def __init__(self, name: str | None, null: int = 0, isin: list[int] | None = None,
                 also: tuple[str, ...] = (), field: tuple[int, int] | None = None) -> None:
        self.name, self.null, self.isin, self.also, self.field = name, null, isin, also, field


def read_table(conn: sqlite3.Connection, path: str, table: str, cols: list[Column],
               keep: tuple[str, list[int]] | None = None) -> list[np.ndarray]:
    """The columns of every row of ``table`` (rowid order, as a scan), int64; with ``keep=(column, ids)``
    only the rows whose column holds one of ``ids`` (NULL never). Raises Unsupported."""
    if any(os.path.exists(path + s) for s in ("-wal", "-journal", "-shm")):
        raise Unsupported("journal or WAL file beside the database")
    try:
        return _read_table(conn, path, table, cols, keep)
    except sqlite3.Error as e:  # (SQL reads the table again, and words what is wrong its own way)
        raise Unsupported(f"SQLite: {e}") from None


def _read_table(conn: sqlite3.Connection, path: str, table: str, cols: list[Column],
                keep: tuple[str, list[int]] | None) -> list[np.ndarray]:
    info = conn.execute(f'PRAGMA table_xinfo("{table}")').fetchall()  # cid, name, type, notnull, dflt, pk, hidden
    if any(r[6] for r in info):
        raise Unsupported("hidden or generated columns")
    pos = {r[1]: i for i, r in enumerate(info)}
    pks = [r for r in info if r[5]]
    rowid_alias = pks[0][1] if len(pks) == 1 and str(pks[0][2]).upper() == "INTEGER" else None
    wanted = sorted({n for c in cols if c.name for n in (c.name, *c.also)} | ({keep[0]} if keep else set()))
    for name in wanted:
        if name not in pos or name == rowid_alias or "INT" not in str(info[pos[name]][2]).upper():
            raise Unsupported(f"column {name}")
    row = conn.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
    if not row or not isinstance(row[0], int) or row[0] < 2:
        raise Unsupported("root page")
    conn.execute("BEGIN")
    try:
        conn.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchall()  # the read transaction takes its lock here
        try:
            fd, st = open_regular_fd(path)  # (the one way inputs are opened: regular files, confinement)
        except (OSError, NotRegularFile) as e:
            raise Unsupported(f"cannot open: {e}") from None
        try:
            if st.st_size < 512:
                raise Unsupported("file too small")
            # (no MAP_POPULATE: it maps every page of the file, 40 ms of CPU for 225 MB here, in each of the
            # threads reading a table, also for an empty table; a page fault maps several pages of the
            # file's cache at once (the kernel's fault-around) and a table reads only its own pages. 2 M
            # kernels + 2 M launches: the runtime table's read 155-194 ms of CPU against 187-245 ms
            # populated, an empty table's 1 ms against 40)
            try:
                mm = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            except (OSError, ValueError) as e:  # (a file system that cannot map files)
                raise Unsupported(f"cannot map the file: {e}") from None
        finally:
            os.close(fd)
        try:
            return _read(np.frombuffer(mm, dtype=np.uint8), int(row[0]), [pos[n] for n in wanted], wanted, cols, keep)
        except (IndexError, ValueError, OverflowError) as e:  # offsets past the file's end: a broken file
            raise Unsupported(f"broken page ({e})") from None
        finally:
            try:
                mm.close()
            except BufferError:  # (a view still open: the map goes with the last reference)
                pass
    finally:
        conn.rollback()


def _read(buf: np.ndarray, root: int, idx: list[int], names: list[str], cols: list[Column],
          keep: tuple[str, list[int]] | None) -> list[np.ndarray]:
    if bytes(buf[:16]) != b"SQLite format 3\x00" or buf[18] != 1 or buf[19] != 1:
        raise Unsupported("not a rollback-journal SQLite 3 file")
    page = int(buf[16]) << 8 | int(buf[17])
    page = 65536 if page == 1 else page
    if page < 512 or page & (page - 1):
        raise Unsupported("page size")
    usable = page - int(buf[20])
    if usable < 480:
        raise Unsupported("reserved bytes")
    npages = buf.size // page
    leaves = _leaves(buf, root, page, npages)
    base = leaves.astype(np.int64) * page - page
    ncell = _u16(buf, base + 3)
    total = int(ncell.sum())
    if total == 0:  # (an empty table: its root page is a leaf without cells)
        return [np.zeros(0, dtype=np.int64) for _ in cols]
    # leaf pages in blocks of about BLOCK_CELLS rows
    ends = np.searchsorted(np.cumsum(ncell), np.arange(BLOCK_CELLS, total + BLOCK_CELLS, BLOCK_CELLS), side="right")
    blocks = []
    lo = 0
    for hi in sorted(set(ends.tolist()) | {leaves.size}):  # (np.unique imports numpy.ma: 15-60 ms here)
        n = int(ncell[lo:hi].sum()) if hi > lo else 0
        if n:
            blocks.append((lo, hi, n))
        lo = max(lo, hi)
    shown = {nm for c in cols if c.name for nm in (c.name, *c.also)}
    # a column read only to filter rows goes to one scratch array, reused block after block
    scratch = np.empty(max(b[2] for b in blocks), dtype=np.int64)
    outs = {nm: np.empty(total, dtype=np.int64) if nm in shown else scratch for nm in names}
    null_at: dict[str, list[np.ndarray]] = {nm: [] for nm in names}  # rows holding NULL (few or none)
    # a field is decoded alone (fewer bytes) when it is all that is asked of that column
    fields = {}
    for nm in names:
        uses = {(c.field, c.isin is None) for c in cols if c.name == nm}
        alone = len(uses) == 1 and not any(nm in c.also for c in cols) and not (keep and keep[0] == nm)
        fields[nm] = next(iter(uses))[0] if alone and next(iter(uses))[1] else None
    at = 0
    col_of = dict(zip(names, idx))
    width = [ROW_BYTES]  # bytes of each row gathered by the row decode (grown when a layout needs more)
    maxcol = max(idx)
    for lo, hi, n in blocks:
        # each block's rows decoded in place, where the result's next rows go (then packed when filtered)
        dest = {nm: outs[nm][at:at + n] if nm in shown else scratch[:n] for nm in names}
        vals = _block(buf, base[lo:hi], ncell[lo:hi], usable, col_of, maxcol, dest, fields, width)
        m = None
        if keep is not None:
            v, isnull = vals[keep[0]]
            m = np.isin(v, np.asarray(keep[1], dtype=np.int64))
            if isnull is not None:
                m &= ~isnull
            if m.all():
                m = None
        if m is None:
            k = n
            for name, (v, isnull) in vals.items():
                if isnull is not None and name in shown:
                    null_at[name].append(np.flatnonzero(isnull) + at)
        else:
            k = int(np.count_nonzero(m))
            for name, (v, isnull) in vals.items():
                if name not in shown:
                    continue
                outs[name][at:at + k] = v[m]  # (v[m] a copy: the rows move down within the same array)
                if isnull is not None and (isnull & m).any():
                    null_at[name].append(np.flatnonzero(isnull[m]) + at)
        at += k
    nulls = {name: np.concatenate(v) if v else None for name, v in null_at.items()}
    res = []
    for c in cols:
        if c.name is None:
            res.append(np.full(at, c.null, dtype=np.int64))
            continue
        v = outs[c.name][:at]
        if c.isin is not None:
            ids = np.asarray(c.isin, dtype=np.int64)
            hit = np.zeros(at, dtype=bool)
            for name in (c.name, *c.also):
                h = np.isin(outs[name][:at], ids)
                if nulls[name] is not None:
                    h[nulls[name]] = False
                hit |= h
            res.append(hit.astype(np.int64))
        else:
            if c.field is not None and fields[c.name] is None:
                v = v & (((1 << (8 * c.field[1])) - 1) << (8 * c.field[0]))
            if nulls[c.name] is not None:
                v = v.copy() if sum(1 for d in cols if d.name == c.name) > 1 else v
                v[nulls[c.name]] = c.null
            res.append(v)
    return res


def _u16(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return buf[at].astype(np.int64) << 8 | buf[at + 1]


def _u32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _u16(buf, at) << 16 | _u16(buf, at + 2)


def _leaves(buf: np.ndarray, root: int, page: int, npages: int) -> np.ndarray:
    """Leaf page numbers of the table b-tree at ``root``, in key order (level by level; every leaf of a
    b-tree is at the same depth)."""
    level = np.array([root], dtype=np.int64)
    for _ in range(_MAX_DEPTH):
        if level.size > npages or level.min() < 2 or level.max() > npages:
            raise Unsupported("page number out of the file")
        base = level * page - page
        kind = buf[base]
        if (kind == 13).all():
            return level
        if not (kind == 5).all():
            raise Unsupported("not a table b-tree page")
        n = _u16(buf, base + 3)
        if (n * 2 + 12 > page).any():
            raise Unsupported("cell count")
        right = _u32(buf, base + 8)  # the right-most pointer
        # children in order: each page's cells' left pointers, then its right-most pointer
        per = n + 1
        first = np.cumsum(per) - per
        tot = int(per.sum())
        which = np.repeat(np.arange(level.size), per)
        k = np.arange(tot) - first[which]
        is_right = k == n[which]
        ptr = _u16(buf, base[which] + 12 + 2 * np.minimum(k, n[which] - 1).clip(0))
        if ((ptr < 12) | (ptr > page - 4))[~is_right].any():
            raise Unsupported("cell pointer")
        child = _u32(buf, np.where(is_right, base[which] + 8, base[which] + ptr))
        child[is_right] = right[which[is_right]]
        level = child
    raise Unsupported("b-tree too deep")


def _varint(buf: np.ndarray, at: np.ndarray, value: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """SQLite varints at ``at``: values (when ``value``) and lengths. One gather of a byte per step over
    the whole block (a step only while some varint goes on: 1 byte for values below 128)."""
    b = buf[at]
    v = b.astype(np.int64) if value else None
    ln = np.ones(at.size, dtype=np.int64)
    cont = b >= 0x80
    if not cont.any():
        return v, ln
    _varint_rest(v, ln, cont, lambda i: buf[i:][at])
    return v, ln


def _varint_rest(v: np.ndarray | None, ln: np.ndarray, cont: np.ndarray, byte_at) -> None:
    """Bytes 1-8 of varints whose first byte is in ``v`` (None: lengths only) and ``cont`` says which go on:
    ``byte_at(i)`` gives byte i of each; ``v`` and ``ln`` updated in place."""
    if v is not None:
        v &= 0x7F
    for i in range(1, 9):
        b = byte_at(i)
        if v is not None:
            nv = v << (8 if i == 8 else 7)
            nv |= b if i == 8 else (b & 0x7F)
            np.copyto(v, nv, where=cont)
        ln += cont
        if i == 8:
            break
        cont &= b >= 0x80
        if not cont.any():
            break


def _block(buf: np.ndarray, base: np.ndarray, ncell: np.ndarray, usable: int, col_of: dict[str, int], maxcol: int,
           dest: dict[str, np.ndarray], fields: dict, width: list[int]) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """The wanted columns (value, NULL 0; where NULL, or None when none is) of the rows of a block of leaf
    pages; the values written into ``dest``'s arrays."""
    n = int(ncell.sum())
    if (ncell * 2 + 8 > usable).any():
        raise Unsupported("cell count")
    # the pages' cell pointer arrays (big-endian 2-byte offsets from byte 8 of each leaf page), each page's
    # copied at once, then its first ncell pointers in order
    mc = int(ncell.max())
    arrays = np.ndarray((buf.size - 2 * mc + 1,), dtype=np.dtype((np.void, 2 * mc)), buffer=buf, strides=(1,))
    ptr = arrays[base + 8].view(">u2").reshape(base.size, mc)[np.arange(mc) < ncell[:, None]].astype(np.int64)
    pbase = np.repeat(base, ncell)
    if ((ptr < 8) | (ptr >= usable)).any():
        raise Unsupported("cell pointer")
    cell = pbase + ptr
    if ROW_DECODE:
        got = _rows(buf, cell, usable, pbase, col_of, maxcol, dest, fields, width)
        if got is not None:
            return got
    return _cells(buf, cell, pbase, usable, col_of, maxcol, dest, fields)


def _cells(buf: np.ndarray, cell: np.ndarray, pbase: np.ndarray, usable: int, col_of: dict[str, int], maxcol: int,
           dest: dict[str, np.ndarray], fields: dict) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """The wanted columns of the rows whose cells start at ``cell`` (on the pages at ``pbase``), any
    layout, one byte of the file at a time: each row's own positions followed (serial types, then the
    values' bytes)."""
    plen, l1 = _varint(buf, cell)
    cell += l1
    _, l2 = _varint(buf, cell, value=False)
    rec = cell
    rec += l2
    end = rec + plen
    if (plen > usable - 35).any() or (end > pbase + usable).any():
        raise Unsupported("overflowing or broken row")
    hlen, l3 = _varint(buf, rec)
    hend = rec + hlen
    t0 = rec + l3  # the serial types
    body = hend.copy()
    wanted = {c: name for name, c in col_of.items()}
    got: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    # While every serial type so far is one byte (integers, NULL, REAL, short text and blobs), column c's
    # is the header's byte c: read from a view of the file c bytes on, at the same offsets (no new index
    # array); after a longer one, each row's position is followed instead.
    t = None
    if int((hend - t0).min()) < maxcol + 1:
        raise Unsupported("row with fewer columns than the table")
    for c in range(maxcol + 1):
        lut = _LUT_INT if c in wanted else _LUT
        if t is None:
            st = buf[c:][t0]
            if int(st.max()) >= 0x80:  # a serial type of two bytes or more (text or a blob of 58 bytes or more)
                t = t0 + c
        if t is not None:
            if (t >= hend).any():
                raise Unsupported("row with fewer columns than the table")
            st, ln = _varint(buf, t)
            t += ln
            size = np.where(st < 12, lut[np.minimum(st, 11)], -1 if c in wanted else (st - 12) >> 1)
        else:
            size = lut[st]
        if int(size.min()) < 0:
            raise Unsupported("value that is not an integer" if c in wanted else "reserved serial type")
        if c in wanted:
            # the value's bytes, big-endian, gathered one byte position at a time (to the block's widest):
            # byte j from a view of the file j bytes on, at the offsets of the widest value's first byte
            m = int(size.max())
            v = dest[wanted[c]]
            field = fields.get(wanted[c])
            if field is not None and m and int(size.min()) >= field[0] + field[1]:
                # only the field's bytes: byte lo + i (from the least significant) ends i + lo + 1 bytes
                # before the value's end
                f_lo, f_n = field
                at = body + size
                at -= f_lo + f_n
                v[:] = buf[at]
                for j in range(1, f_n):
                    v <<= 8
                    v |= buf[j:][at]
                v <<= 8 * f_lo
                field = None
            elif m:
                at = body + size
                at -= m
                v[:] = buf[at]
                for j in range(1, m):
                    v <<= 8
                    v |= buf[j:][at]
                if int(size.min()) == m:
                    if m < 8:
                        v <<= 64 - 8 * m
                        v >>= 64 - 8 * m
                else:  # keep each row's own `size` bytes, sign-extended
                    sh = np.minimum(64 - 8 * size, 63)
                    v <<= sh
                    v >>= sh
                    v[size == 0] = 0
            else:
                v.fill(0)
            lo_st, hi_st = int(st.min()), int(st.max())
            if hi_st == 9:
                v[st == 9] = 1
            if field is not None:
                v &= ((1 << (8 * field[1])) - 1) << (8 * field[0])
            isnull = st == 0 if lo_st == 0 else None
            got[wanted[c]] = (v, isnull)
        body += size
    if (body > end).any():
        raise Unsupported("row longer than its payload")
    return got


def _row_byte(R: np.ndarray, off, rowbase: np.ndarray | None) -> np.ndarray:
    """Byte ``off`` of each row of R: a strided column when ``off`` is one number, else each row's own."""
    if isinstance(off, int):
        return R[:, off]
    return R.reshape(-1)[rowbase + off]


def _row_varint(R: np.ndarray, off, rowbase: np.ndarray | None) -> tuple[np.ndarray, object]:
    """Varints at ``off`` of each row of R (as :func:`_varint`): values, and lengths (one int when all
    are 1 byte long, the common case)."""
    b = _row_byte(R, off, rowbase)
    v = b.astype(np.int64)
    cont = b >= 0x80
    if not cont.any():
        return v, 1
    ln = np.ones(R.shape[0], dtype=np.int64)
    if rowbase is None:
        rowbase = np.arange(R.shape[0], dtype=np.int64) * R.shape[1]
    _varint_rest(v, ln, cont, lambda i: _row_byte(R, off + i, rowbase))
    lo = int(ln.min())
    return v, (lo if lo == int(ln.max()) else ln)


def _gather_rows(buf: np.ndarray, cell: np.ndarray, W: int) -> np.ndarray:
    """(rows, W) bytes: W bytes of the file from each cell on (zeros past the file's end: bytes no check
    lets a value be read from)."""
    view = np.ndarray((buf.size - W + 1,), dtype=np.dtype((np.void, W)), buffer=buf, strides=(1,))
    limit = buf.size - W
    if int(cell.max()) <= limit:
        return view[cell].view(np.uint8).reshape(cell.size, W)
    near = cell > limit  # (rows of the file's last page, near its end)
    R = np.empty((cell.size, W), dtype=np.uint8)
    R[~near] = view[cell[~near]].view(np.uint8).reshape(-1, W)
    tail = np.zeros(2 * W, dtype=np.uint8)
    tail[:W] = buf[limit:]
    R[near] = np.ndarray((W + 1,), dtype=np.dtype((np.void, W)), buffer=tail,
                         strides=(1,))[cell[near] - limit].view(np.uint8).reshape(-1, W)
    return R


def _rowid_length(R: np.ndarray, l1, rowbase: np.ndarray | None):
    """Length of the rowid varint of each row of R, at ``l1`` (the payload length's varint length): one
    int when every row's is the first row's (rowids of one block of a table are close: the common case,
    checked on the continuation bits of one column per byte), else per row."""
    if isinstance(l1, int):
        ln = 1
        while ln < 9 and R[0, l1 + ln - 1] >= 0x80:
            ln += 1
        if all(bool((R[:, l1 + i] >= 0x80).all()) for i in range(ln - 1)) and \
                (ln == 9 or bool((R[:, l1 + ln - 1] < 0x80).all())):
            return ln
        rowbase = np.arange(R.shape[0], dtype=np.int64) * R.shape[1]
    cont = _row_byte(R, l1, rowbase) >= 0x80
    ln = np.ones(R.shape[0], dtype=np.int64)
    for i in range(1, 9):
        ln += cont
        if i == 8:
            break
        cont &= _row_byte(R, l1 + i, rowbase) >= 0x80
        if not cont.any():
            break
    return ln


def _wide(R: np.ndarray, off: int, size: int, out: np.ndarray) -> None:
    """The big-endian signed integers of ``size`` bytes at byte ``off`` of each row of R, into ``out``:
    one strided read of a 1, 2, 4 or 8-byte big-endian view (3 and 6 bytes: the 4 or 8 bytes ending
    with the value, the bytes before it shifted out, sign-extended)."""
    wide = {1: 1, 2: 2, 3: 4, 4: 4, 6: 8, 8: 8}[size]
    view = np.ndarray((R.shape[0],), dtype=np.dtype(f">i{wide}") if wide > 1 else np.int8, buffer=R,
                      offset=off - (wide - size), strides=(R.shape[1],))
    np.copyto(out, view, casting="unsafe")
    if wide != size:
        sh = 64 - 8 * size
        out <<= sh
        out >>= sh


def _rows(buf: np.ndarray, cell: np.ndarray, usable: int, pbase: np.ndarray, col_of: dict[str, int], maxcol: int,
          dest: dict[str, np.ndarray], fields: dict, width: list[int]) -> dict | None:
    """:func:`_cells`'s result for the same rows, or None (then _cells reads them all): each row's first
    bytes gathered at once (one copy of ``width[0]`` bytes per row, from a view of the file whose
    elements are that many bytes starting at every byte), then, for the rows sharing a layout (the
    varints' lengths, the header length and the serial types up to the last wanted column, compared as
    two integers per row), each wanted column read at its fixed position by one strided read of a
    big-endian view: no per-row offsets, no byte-at-a-time gathers. Same checks as _cells, row for row;
    the rows of other layouts go to _cells.

    Why: _cells costs about 190 ns per row of the kernel table (30 one-byte gathers and the per-row offset
    arithmetic between them), this about 50 (bench/bench_trace.py, docs/performance.md)."""
    n = cell.size
    k = maxcol + 2  # the header's length (one byte) and the serial types of columns 0 .. maxcol
    if n == 0 or k > 16 or any(f is not None and f[0] + f[1] >= 8 for f in fields.values()):
        return None
    wanted = {c: name for name, c in col_of.items()}
    while True:
        W = width[0] = max(width[0], _MIN_ROW_BYTES)
        if buf.size < W:
            return None
        R = _gather_rows(buf, cell, W)
        rowbase = None
        plen, l1 = _row_varint(R, 0, None)
        if not isinstance(l1, int):
            rowbase = np.arange(n, dtype=np.int64) * W
        l2 = _rowid_length(R, l1, rowbase)
        if not isinstance(l2, int) and rowbase is None:
            rowbase = np.arange(n, dtype=np.int64) * W
        r = l1 + l2  # where the record (its header) starts in the row
        end = cell + r
        end += plen
        if (plen > usable - 35).any() or (end > pbase + usable).any():
            raise Unsupported("overflowing or broken row")
        del end
        if isinstance(r, int):
            groups = [(None, r)]
        else:
            counts = np.bincount(r)
            groups = [(np.flatnonzero(r == v), int(v)) for v in np.flatnonzero(counts)]
            if len(groups) == 1:
                groups = [(None, groups[0][1])]
        got: dict[str, list] = {name: [dest[name], None] for name in col_of}
        left: list[np.ndarray] = []
        retry = False
        for rows, r0 in groups:
            Rs = R if rows is None else R[rows]
            retry = _layouts(Rs, rows, r0, plen if rows is None else plen[rows], k, maxcol, wanted, fields, got, left,
                             width, n)
            if retry:
                break
        if not retry:
            break
    if left:
        rest = np.concatenate(left) if len(left) > 1 else left[0]
        sub = _cells(buf, cell[rest], pbase[rest], usable, col_of, maxcol,
                     {name: np.empty(rest.size, dtype=np.int64) for name in col_of}, fields)
        for name, (v, isnull) in sub.items():
            got[name][0][rest] = v
            if isnull is not None:
                if got[name][1] is None:
                    got[name][1] = np.zeros(n, dtype=bool)
                got[name][1][rest] = isnull
    return {name: (v, isnull) for name, (v, isnull) in got.items()}


def _layouts(Rs: np.ndarray, rows: np.ndarray | None, r: int, plen: np.ndarray, k: int, maxcol: int,
             wanted: dict[int, str], fields: dict, got: dict, left: list, width: list[int], n: int) -> bool:
    """The rows of Rs (whose records start at byte ``r``; ``rows``: their places in the block, None: all)
    by layout, up to _MAX_LAYOUTS layouts; the rest appended to ``left``. True: a layout needs more bytes
    per row than gathered (``width`` grown: gather again)."""
    W = Rs.shape[1]
    ns = Rs.shape[0]
    key = np.ndarray((ns,), dtype="<u8", buffer=Rs, offset=r, strides=(W,)) & np.uint64((1 << (8 * min(k, 8))) - 1)
    key2 = None
    if k > 8:
        key2 = np.ndarray((ns,), dtype="<u8", buffer=Rs, offset=r + 8, strides=(W,)) & np.uint64((1 << (8 * (k - 8))) - 1)
    rem = None  # the rows (of Rs) not decoded yet; None: all
    for _ in range(_MAX_LAYOUTS):
        j = 0 if rem is None else int(rem[0])
        if rem is None:
            eq = key == key[j]
            if key2 is not None:
                eq &= key2 == key2[j]
        else:
            eq = key[rem] == key[j]
            if key2 is not None:
                eq &= key2[rem] == key2[j]
        if eq.all():
            g, rem_next = rem, np.zeros(0, dtype=np.int64)
        else:
            g = np.flatnonzero(eq) if rem is None else rem[eq]
            rem_next = np.flatnonzero(~eq) if rem is None else rem[~eq]
        lay = Rs[j, r:r + k].tolist()
        hlen, types = lay[0], lay[1:]
        if hlen >= 0x80 or max(types) >= 0x80:
            left.append(_at(rows, g, ns))  # (a header of 128 bytes or more, a long text or blob: _cells)
        else:
            if hlen - 1 < maxcol + 1:
                raise Unsupported("row with fewer columns than the table")
            sizes = []
            for c, t in enumerate(types):
                size = int((_LUT_INT if c in wanted else _LUT)[t])
                if size < 0:
                    raise Unsupported("value that is not an integer" if c in wanted else "reserved serial type")
                sizes.append(size)
            body = r + hlen
            need = body + sum(sizes)
            if need > W:
                if need > _MAX_ROW_BYTES:
                    left.append(_at(rows, g, ns))
                else:
                    width[0] = -(-need // 8) * 8
                    return True
            else:
                pl = plen if g is None else plen[g]
                if (pl < need - r).any():
                    raise Unsupported("row longer than its payload")
                Rg = Rs if g is None else Rs[g]
                whole = rows is None and g is None
                at = None if whole else _at(rows, g, ns)
                off = body
                for c, t in enumerate(types):
                    name = wanted.get(c)
                    if name is not None:
                        v = got[name][0]
                        out = v if whole else np.empty(Rg.shape[0], dtype=np.int64)
                        if t in (0, 8, 9):
                            out.fill(1 if t == 9 else 0)
                        else:
                            _wide(Rg, off, sizes[c], out)
                        f = fields.get(name)
                        if f is not None:
                            out &= ((1 << (8 * f[1])) - 1) << (8 * f[0])
                        if not whole:
                            v[at] = out
                        if t == 0:
                            if got[name][1] is None:
                                got[name][1] = np.zeros(n, dtype=bool)
                            got[name][1][slice(None) if whole else at] = True
                    off += sizes[c]
        rem = rem_next
        if rem.size == 0:
            return False
    left.append(_at(rows, rem, ns))
    return False


def _at(rows: np.ndarray | None, g: np.ndarray | None, ns: int) -> np.ndarray:
    """Places in the block of rows ``g`` of a group (None: all of it) whose rows are at ``rows`` (None:
    the whole block)."""
    if g is None:
        return np.arange(ns, dtype=np.int64) if rows is None else rows
    return g if rows is None else rows[g]
