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
            # (MAP_POPULATE: the file's pages mapped in one call, not one page fault at a time)
            try:
                mm = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                               prot=mmap.PROT_READ)
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
    for hi in np.unique(np.append(ends, leaves.size)).tolist():
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
    maxcol = max(idx)
    for lo, hi, n in blocks:
        # each block's rows decoded in place, where the result's next rows go (then packed when filtered)
        dest = {nm: outs[nm][at:at + n] if nm in shown else scratch[:n] for nm in names}
        vals = _block(buf, base[lo:hi], ncell[lo:hi], usable, col_of, maxcol, dest, fields)
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
    if value:
        v &= 0x7F
    for i in range(1, 9):
        b = buf[i:][at]
        if value:
            nv = v << (8 if i == 8 else 7)
            nv |= b if i == 8 else (b & 0x7F)
            np.copyto(v, nv, where=cont)
        ln += cont
        if i == 8:
            break
        cont &= b >= 0x80
        if not cont.any():
            break
    return v, ln


def _block(buf: np.ndarray, base: np.ndarray, ncell: np.ndarray, usable: int, col_of: dict[str, int], maxcol: int,
           dest: dict[str, np.ndarray], fields: dict) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """The wanted columns (value, NULL 0; where NULL, or None when none is) of the rows of a block of leaf
    pages; the values written into ``dest``'s arrays when given."""
    n = int(ncell.sum())
    if (ncell * 2 + 8 > usable).any():
        raise Unsupported("cell count")
    first = np.cumsum(ncell) - ncell
    which = np.repeat(np.arange(base.size), ncell)
    pbase = base[which]
    k = np.arange(n) - first[which]
    k *= 2
    k += pbase
    k += 8
    ptr = _u16(buf, k)
    if ((ptr < 8) | (ptr >= usable)).any():
        raise Unsupported("cell pointer")
    cell = pbase + ptr
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
