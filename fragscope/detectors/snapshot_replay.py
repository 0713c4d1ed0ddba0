"""OOM replay: rebuild a device's segments at an ``oom`` trace entry by undoing the entries after it.

A snapshot shows memory when ``_snapshot()`` ran, usually after the OOM unwound and freed tensors.
:func:`replay_to_oom` starts from that state and undoes the device trace entries recorded after the
``oom`` entry, newest first (the way PyTorch's MemoryViz.js ``simulate_memory`` walks back), to rebuild
each segment's live blocks at the OOM; free space is what lies between them, so adjacent free ranges
merge as the allocator coalesces them. An entry that does not fit the state stops the replay, and the
OOM is then judged on the dump-time state, flagged stale, with the reason. Rules: docs/snapshot.md.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

import numpy as np

from ..collectors.snapshot import ALLOCATED, INACTIVE, PENDING_FREE, OomEvent, Snapshot, TraceTail, \
    allocator_settings_summary
from .snapshot_allocator import K_LARGE_BUFFER, K_MAX_NON_SPLIT_ROUNDING, K_ROUND_LARGE, K_SMALL_BUFFER, \
    K_SMALL_SIZE, fmt_bytes, round_request
from .snapshot_state import BlockColumns, SegState, SnapshotConfig

class _RSeg:
    """A segment the replay has touched: address range and live (non-free) blocks by address."""

    __slots__ = ("addr", "blocks", "expandable", "large", "pool", "starts", "stream", "total")

    def __init__(self, addr: int, total: int, stream: int, pool: int, large: bool, expandable: bool,
                 starts: list[int], blocks: dict[int, list]):
        self.addr, self.total, self.stream, self.pool = addr, total, stream, pool
        self.large, self.expandable = large, expandable
        self.starts = starts  # sorted addresses of live blocks
        self.blocks = blocks  # address -> [size, state, re-created by the replay]

    @property
    def end(self) -> int:
        return self.addr + self.total


@dataclass(slots=True)
class Replay:
    """Outcome of undoing the trace entries recorded after one OOM (see :func:`replay_to_oom`)."""

    complete: bool
    replayed_entries: int  # entries undone (all entries after the OOM when complete)
    problem: str | None  # why the replay stopped (None when complete)
    assumptions: list[str]
    state: SegState | None  # the device's segments at the OOM (None when not complete)


_NOOP_ACTIONS = frozenset({"snapshot", "oom", "annotate"})


class _Replayer:
    """Undo trace entries newest first over one device's segments; segments load their blocks lazily."""

    def __init__(self, snap: Snapshot, device: int, settings: dict):
        self.snap = snap
        idx = np.flatnonzero(snap.seg_device == device)
        idx = idx[np.argsort(snap.seg_address[idx], kind="stable")]
        self.dev_idx = idx
        self.starts: list[int] = snap.seg_address[idx].tolist()
        self.keys: list[int] = idx.tolist()  # snapshot row, or a negative key for a new segment
        self.live: dict[int, _RSeg] = {}
        self.replaced: set[int] = set()  # snapshot rows now described by ``live`` (or gone)
        self.pools = list(snap.pools)
        self.next_key = -1
        raw = snap.allocator_settings or {}
        div = raw.get("roundup_power2_divisions")
        self.divisions = div if isinstance(div, dict) else None
        self.settings_known = bool(snap.allocator_settings)
        mss = settings.get("max_split_size_bytes")
        self.max_split = mss if isinstance(mss, int) else None
        self.assumed: dict[str, int] = {}
        self.recreated = 0

    # -- lookups ---------------------------------------------------------------------------
    def _extent(self, k: int) -> tuple[int, int]:
        if k in self.live:
            g = self.live[k]
            return g.addr, g.total
        return int(self.snap.seg_address[k]), int(self.snap.seg_total[k])

    def _find(self, a: int) -> int:
        """Position in ``keys`` of the segment containing address ``a``; -1 if none."""
        i = bisect_right(self.starts, a) - 1
        if i < 0:
            return -1
        base, total = self._extent(self.keys[i])
        return i if a < base + total else -1

    def _overlaps(self, a: int, size: int) -> bool:
        i = bisect_right(self.starts, a + size - 1) - 1  # last segment starting inside or before the range
        if i < 0:
            return False
        base, total = self._extent(self.keys[i])
        return base + total > a

    def _load(self, i: int) -> _RSeg:
        k = self.keys[i]
        g = self.live.get(k)
        if g is not None:
            return g
        s = self.snap
        lo, n, base = int(s.seg_first_block[k]), int(s.seg_nblocks[k]), int(s.seg_address[k])
        states = s.blk_state[lo:lo + n]
        act = states != INACTIVE
        starts = (base + s.blk_offset[lo:lo + n][act]).tolist()
        blocks = {a: [sz, st, False] for a, sz, st in zip(starts, s.blk_size[lo:lo + n][act].tolist(),
                                                          states[act].tolist())}
        g = _RSeg(base, int(s.seg_total[k]), int(s.seg_stream[k]), int(s.seg_pool[k]), bool(s.seg_large[k]),
                  bool(s.seg_expandable[k]), starts, blocks)
        self.live[k] = g
        self.replaced.add(k)
        return g

    def _remove(self, i: int) -> None:
        self.starts.pop(i)
        self.live.pop(self.keys.pop(i), None)

    def _insert(self, g: _RSeg) -> None:
        k = self.next_key
        self.next_key -= 1
        i = bisect_left(self.starts, g.addr)
        self.starts.insert(i, g.addr)
        self.keys.insert(i, k)
        self.live[k] = g

    def _pool(self, pool: tuple[int, int] | None, what: str) -> int:
        if pool is None:
            self.assumed[what] = self.assumed.get(what, 0) + 1
            return 0
        if pool not in self.pools:
            self.pools.append(pool)
        return self.pools.index(pool)

    @staticmethod
    def _holder(g: _RSeg, a: int, end: int) -> int | None:
        """Address of a live block overlapping [a, end), or None."""
        j = bisect_right(g.starts, a) - 1
        if j >= 0 and g.starts[j] + g.blocks[g.starts[j]][0] > a:
            return g.starts[j]
        j += 1
        if j < len(g.starts) and g.starts[j] < end:
            return g.starts[j]
        return None

    # -- one entry -------------------------------------------------------------------------
    def undo(self, action: str, a: int | None, size: int | None, stream: int,
             pool: tuple[int, int] | None) -> str | None:
        """Undo one entry; returns what did not fit, or None."""
        if action in _NOOP_ACTIONS:
            return None
        if action not in ("alloc", "free_requested", "free_completed", "free", "segment_alloc", "segment_free",
                          "segment_map", "segment_unmap"):
            # what an unknown action did to the state cannot be undone: stop rather than guess
            return "not a trace entry fragscope can undo (unknown action)"
        if a is None or size is None:
            return "the entry has no integer addr/size"
        if action in ("segment_free", "segment_unmap"):
            return self._undo_release(action, a, size, stream, pool)
        i = self._find(a)
        if i < 0:
            return "the address is not inside any known segment"
        g = self._load(i)
        if action in ("alloc", "free_completed", "free", "segment_map") and g.stream != stream:
            return f"the segment there belongs to stream {g.stream}, the entry to stream {stream}"
        if action == "alloc":  # the block was free at the OOM
            b = g.blocks.get(a)
            if b is None:
                return "no live block starts there, yet the entry allocated it"
            if b[0] < size:
                return f"the live block there is {b[0]} B, smaller than the {size} B allocated"
            del g.blocks[a]
            g.starts.pop(bisect_left(g.starts, a))
        elif action == "free_requested":  # the block was still allocated (not yet waiting on streams)
            b = g.blocks.get(a)
            if b is None or b[1] != PENDING_FREE:
                return "no block waiting to be freed starts there"
            b[1] = ALLOCATED
        elif action in ("free_completed", "free"):  # the block still held memory at the OOM
            j = bisect_right(g.starts, a)
            if j > 0 and g.starts[j - 1] + g.blocks[g.starts[j - 1]][0] > a:
                return f"the address is inside a live block at {g.starts[j - 1]:#x}"
            limit = g.starts[j] if j < len(g.starts) else g.end  # the next live block, or the segment end
            if a + size > limit:
                return "the freed block does not fit in the free space there"
            # entries carry the requested size; the block is that size rounded (clipped to the space)
            b_size = min(round_request(size, self.divisions), limit - a)
            g.blocks[a] = [b_size, PENDING_FREE, True]
            insort(g.starts, a)
            self.recreated += 1
        elif action == "segment_alloc":  # the segment did not exist at the OOM
            if g.addr != a or g.total != size or g.expandable:
                return f"the segment there spans {g.addr:#x} + {g.total} B, not the one the entry created"
            if g.blocks:
                return f"the segment still holds {len(g.blocks)} live block(s) at that point"
            self._remove(i)
        else:  # segment_map (expandable): the range was not mapped at the OOM
            end = a + size
            if not g.expandable:
                return "segment_map inside a segment that is not expandable"
            if end > g.end:
                return "the mapped range runs past the end of its segment"
            h = self._holder(g, a, end)
            if h is not None:
                return f"the range still holds a live block at {h:#x}"
            self._remove(i)
            for lo, hi in ((g.addr, a), (end, g.end)):
                if hi > lo:
                    part = [x for x in g.starts if lo <= x < hi]
                    self._insert(_RSeg(lo, hi - lo, g.stream, g.pool, g.large, True, part,
                                       {x: g.blocks[x] for x in part}))
        return None

    def _undo_release(self, action: str, a: int, size: int, stream: int, pool) -> str | None:
        """segment_free / segment_unmap: the range existed, entirely free, at the OOM."""
        if self._overlaps(a, size):
            return "the released range overlaps a segment that exists at that point"
        if action == "segment_free":
            # only kSmallBuffer (2 MiB) segments are small-pool ones; large-pool segments are >= 10 MiB
            self._insert(_RSeg(a, size, stream, self._pool(pool, "segment_free"), size != K_SMALL_BUFFER,
                               False, [], {}))
            return None
        # segment_unmap: join the mapped neighbours of the same expandable segment
        end = a + size
        i = bisect_right(self.starts, a) - 1
        left = i if i >= 0 and sum(self._extent(self.keys[i])) == a else -1
        right = i + 1 if i + 1 < len(self.starts) and self.starts[i + 1] == end else -1
        nb = [self._load(j) for j in (left, right) if j >= 0]
        nb = [g for g in nb if g.expandable and g.stream == stream
              and (pool is None or self.pools[g.pool] == pool)]
        if nb:
            pidx, large = nb[0].pool, nb[0].large
        else:
            pidx = self._pool(pool, "segment_unmap")
            large = size % K_LARGE_BUFFER == 0  # large pools map 20 MiB pages, small pools 2 MiB
            if large:
                self.assumed["segment_unmap size class"] = self.assumed.get("segment_unmap size class", 0) + 1
        lo, hi, starts, blocks = a, end, [], {}
        for g in nb:
            if g.large != large or g.pool != pidx:
                continue
            lo, hi = min(lo, g.addr), max(hi, g.end)
            starts += g.starts
            blocks.update(g.blocks)
            self._remove(self.starts.index(g.addr))
        self._insert(_RSeg(lo, hi - lo, stream, pidx, large, True, sorted(starts), blocks))
        return None

    # -- result ----------------------------------------------------------------------------
    def state(self, dump: SegState) -> SegState:
        keep = np.array([k for k in self.dev_idx.tolist() if k not in self.replaced], dtype=np.int64)
        rows = []
        uncertain = 0
        for g in self.live.values():
            row, unc = self._row(g)
            rows.append(row)
            uncertain += unc
        return dump.take(keep).extended(rows, self.pools, uncertain)

    def _row(self, g: _RSeg) -> tuple[tuple, int]:
        allocated = pending = inactive = largest = releasable = nfree = slivers = sliver_b = 0
        uncertain = 0
        gran = K_LARGE_BUFFER if g.large else K_SMALL_BUFFER
        pos = g.addr
        prev = None  # the re-created block just before the current gap, if any
        for a in g.starts + [g.end]:
            gap = a - pos
            if gap > 0:
                inactive += gap
                largest = max(largest, gap)
                nfree += 1
                if g.large and gap < K_ROUND_LARGE:
                    slivers += 1
                    sliver_b += gap
                if g.expandable and g.pool == 0:
                    lo, hi = pos - g.addr, a - g.addr
                    releasable += max(hi // gran - (-(-lo // gran)), 0) * gran
                if prev is not None:
                    uncertain += min(prev, gap)
            if a == g.end:
                break
            size, st, made = g.blocks[a]
            if st == ALLOCATED:
                allocated += size
            else:
                pending += size
            prev = None
            if made and g.large and not g.expandable:
                # a large-pool block is split only when more than 1 MiB would remain (should_split);
                # blocks at or above max_split_size are never split, within max_non_split_rounding
                oversize = self.max_split is not None and size >= self.max_split
                prev = K_MAX_NON_SPLIT_ROUNDING if oversize else K_SMALL_SIZE
            pos = a + size
        if not g.blocks and not g.expandable and g.pool == 0:
            releasable = g.total
        return ((-1, g.total, g.stream, g.pool, g.large, g.expandable, allocated, pending, inactive, largest,
                 releasable, nfree, slivers, sliver_b), uncertain)

    def assumptions(self) -> list[str]:
        out = []
        n = self.assumed.get("segment_free", 0) + self.assumed.get("segment_unmap", 0)
        if n:
            out.append(f"{n} re-created segment(s) counted in the default pool: the trace entries carry no "
                       f"pool id")
        if self.assumed.get("segment_unmap size class"):
            out.append(f"{self.assumed['segment_unmap size class']} unmapped expandable range(s) without a "
                       f"mapped neighbour taken as large-pool (size a multiple of 20 MiB)")
        if self.recreated and not self.settings_known:
            out.append(f"{self.recreated} re-created block(s) sized with 512-byte rounding: allocator settings "
                       f"(roundup_power2_divisions) not recorded")
        return out


def replay_to_oom(snap: Snapshot, oom: OomEvent, settings: dict | None = None,
                  dump: SegState | None = None) -> Replay:
    """Rebuild the device's segments at the ``oom`` entry by undoing the entries recorded after it.

    Undo rules (newest first): ``alloc`` -> the block was free; ``free_requested`` -> the block was still
    allocated; ``free_completed`` -> the block (requested size rounded as the allocator rounds) still held
    memory; ``segment_alloc`` -> the segment did not exist; ``segment_free`` -> it existed, entirely free
    unless an older entry re-creates blocks in it; ``segment_map`` / ``segment_unmap`` (expandable
    segments) -> the range was unmapped / mapped and free. ``snapshot``, ``oom`` and unknown actions
    change nothing. The first entry that does not fit (address outside every known segment, a block that
    is not there, an overlap) stops the replay: ``complete`` is False and ``problem`` names the entry.
    Entries the ring buffer dropped are all older than the OOM, so they do not matter here.
    """
    settings = settings if settings is not None else allocator_settings_summary(snap)
    if dump is None:
        dump = SegState.from_dump(snap, BlockColumns(snap, SnapshotConfig()))
    r = _Replayer(snap, oom.device, settings)
    tail: TraceTail | None = snap.trace_tails.get(oom.device)
    n_after = oom.entries_after
    if n_after and (tail is None or oom.trace_index is None):
        return Replay(False, 0, "the trace entries after the OOM were not kept", [], None)
    done = 0
    if n_after:
        first = oom.trace_index - tail.start + 1
        entries = tail.entries
        for k in range(len(entries) - 1, first - 1, -1):
            action, a, size, stream, pool = entries[k]
            why = r.undo(action, a, size, stream, pool)
            if why is not None:
                where = f" at {a:#x}" if a is not None else ""
                sz = f", {fmt_bytes(size)}" if size is not None else ""
                return Replay(False, done, f"device {oom.device} trace entry #{tail.start + k} ({action}{where}{sz}, "
                                           f"stream {stream}): {why}", r.assumptions(), None)
            done += 1
    return Replay(True, done, None, r.assumptions(), r.state(dump))



__all__ = ["Replay", "replay_to_oom"]
