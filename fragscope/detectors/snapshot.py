"""Memory-snapshot analysis: allocator numbers per device / pool / stream, OOM cause, verdict, playbook.

:func:`analyse_snapshot` is pure (a normalised :class:`~fragscope.collectors.snapshot.Snapshot` in,
a JSON-ready dict and findings out). :func:`analyse_snapshot_file` is the one convenience entry point
that reads a file, for the CLI and the agent's capture feature. Contract: docs/snapshot.md.

Definitions (../shared/notes/formats-and-analyses.md, "Allocator metrics (from a snapshot)"):
inactive = free blocks inside segments (external free); external_fragmentation = 1 − largest free
block / total free; releasable = what ``torch.cuda.empty_cache()`` could hand back (default-pool
segments with no active block, and whole mapping pages of free blocks in expandable segments);
internal waste = size − requested over allocated blocks; slivers = free large-pool blocks < 2 MiB.
No upstream tool gives a fragmentation score or verdict (pytorch/pytorch#29554, open since 2019).

OOM replay. A snapshot shows memory when ``_snapshot()`` ran, usually after the OOM unwound and freed
tensors. :func:`replay_to_oom` starts from that state and undoes the device trace entries recorded after
the ``oom`` entry, newest first (the way PyTorch's MemoryViz.js ``simulate_memory`` walks back), to
rebuild each segment's live blocks at the OOM; free space is what lies between them, so adjacent free
ranges merge as the allocator coalesces them. An entry that does not fit the state stops the replay,
and the OOM is then judged on the dump-time state, flagged stale, with the reason.
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

import numpy as np

from ..collectors.snapshot import (
    ALLOCATED,
    DEFAULT_POOL,
    INACTIVE,
    PENDING_FREE,
    OomEvent,
    Snapshot,
    TraceTail,
    allocator_settings_summary,
    parse_snapshot,
    read_snapshot,
)
from ..model import Evidence, Finding, Inconclusive, Severity, rank_findings

MiB = 1024 * 1024
GiB = 1024 * MiB

# Caching-allocator constants (c10/cuda/CUDACachingAllocator.cpp; notes section 1 "Size classes")
K_SMALL_SIZE = 1 * MiB  # requests up to this size use the small pool
K_SMALL_BUFFER = 2 * MiB  # small-pool segment size; small-pool expandable mapping granularity
K_MIN_LARGE_ALLOC = 10 * MiB  # requests below this share a kLargeBuffer segment
K_LARGE_BUFFER = 20 * MiB  # large-pool segment for 1-10 MiB requests; large expandable mapping granularity
K_ROUND_LARGE = 2 * MiB  # larger requests round up to this
K_MIN_BLOCK = 512  # kMinBlockSize: every block size is a multiple of this
K_MAX_NON_SPLIT_ROUNDING = 20 * MiB  # max_non_split_rounding_mb default (not recorded in snapshots)

# Diagnosis ids this module emits (contracts, docs/snapshot.md)
FRAGMENTATION = "allocator-fragmentation"
OOM_CROSS_STREAM = "oom-cross-stream"
OOM_PRIVATE_POOL = "oom-private-pool"
OOM_MEMORY_CAP = "oom-memory-cap"
OOM_OUTSIDE_PYTORCH = "oom-outside-pytorch"
OOM_CAPACITY = "oom-capacity"
OOM_CLASSES = {  # classification -> finding id
    "fragmentation": FRAGMENTATION,
    "cross-stream": OOM_CROSS_STREAM,
    "private-pool": OOM_PRIVATE_POOL,
    "memory-cap": OOM_MEMORY_CAP,
    "outside-pytorch": OOM_OUTSIDE_PYTORCH,
    "capacity": OOM_CAPACITY,
}
DIAGNOSIS_IDS = (FRAGMENTATION, OOM_CROSS_STREAM, OOM_PRIVATE_POOL, OOM_MEMORY_CAP, OOM_OUTSIDE_PYTORCH,
                 OOM_CAPACITY)


@dataclass(frozen=True, slots=True)
class SnapshotConfig:
    """Thresholds. None of the allocator signals has an upstream threshold; each source is named."""

    # notes "Default thresholds": fragmentation when non-releasable free / reserved > 0.2 (proposed
    # starting value, project-chosen; the same quantity as inactive_split_bytes / reserved_bytes)
    non_releasable_ratio: float = 0.20
    # notes: classic external-fragmentation index; above 0.5 no single free block holds half of the
    # free bytes, so a request of half the free space already fails (project-chosen, notes' proposal)
    external_fragmentation: float = 0.50
    # project-chosen floor: below 256 MiB of stranded free memory the fix is not worth a restart
    # (a fraction of one decode batch's activations on a 7B model)
    min_stranded_bytes: int = 256 * MiB
    # notes: sliver = free large-pool block under 2 MiB (one large-pool rounding unit, kRoundLarge)
    sliver_bytes: int = K_ROUND_LARGE
    # project-chosen: what a CUDA context, cuBLAS workspaces and NCCL typically hold outside the
    # caching allocator on one GPU (0.5-1 GiB); only memory outside PyTorch beyond this is blamed
    outside_pytorch_allowance_bytes: int = 1 * GiB


def alloc_segment_size(request: int) -> int:
    """Bytes the allocator asks the driver for when no cached block fits ``request`` (rounded)."""
    if request <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if request < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-request // K_ROUND_LARGE) * K_ROUND_LARGE


# ---------------------------------------------------------------------------------------------
class _Arrays:
    """Per-block and per-segment helper columns computed once."""

    def __init__(self, snap: Snapshot, cfg: SnapshotConfig):
        self.snap = snap
        st = snap.blk_state
        self.inactive = st == INACTIVE
        self.alloc = st == ALLOCATED
        self.pending = st == PENDING_FREE
        nseg = snap.n_segments
        seg = snap.blk_seg
        self.seg_active_blocks = np.bincount(seg, weights=~self.inactive, minlength=nseg) if seg.size \
            else np.zeros(nseg)
        self.seg_private = snap.seg_pool != 0
        large_blk = snap.seg_large[seg] if seg.size else np.zeros(0, bool)
        self.blk_large = large_blk
        self.sliver = self.inactive & large_blk & (snap.blk_size < cfg.sliver_bytes)
        # releasable per block (expandable segments: whole mapping pages inside free blocks)
        exp_blk = snap.seg_expandable[seg] if seg.size else np.zeros(0, bool)
        gran = np.where(large_blk, K_LARGE_BUFFER, K_SMALL_BUFFER)
        start = snap.blk_offset
        end = start + snap.blk_size
        pages = np.maximum(end // gran - (-(-start // gran)), 0)
        priv_blk = self.seg_private[seg] if seg.size else np.zeros(0, bool)
        self.blk_releasable = np.where(self.inactive & exp_blk & ~priv_blk, pages * gran, 0)
        # releasable per segment (non-expandable default-pool segments without an active block)
        whole = (self.seg_active_blocks == 0) & ~snap.seg_expandable & ~self.seg_private
        self.seg_releasable = np.where(whole, snap.seg_total, 0)
        self.blk_waste = np.where(self.alloc & (snap.blk_requested >= 0),
                                  snap.blk_size - snap.blk_requested, 0)

    def metrics(self, seg_mask: np.ndarray) -> dict:
        snap = self.snap
        bmask = seg_mask[snap.blk_seg] if snap.blk_seg.size else np.zeros(0, bool)
        size = snap.blk_size
        alloc = bmask & self.alloc
        inact = bmask & self.inactive
        inactive_sizes = size[inact]
        inactive_bytes = int(inactive_sizes.sum())
        largest = int(inactive_sizes.max()) if inactive_sizes.size else 0
        req_known = bool((snap.blk_requested[alloc] >= 0).all())
        allocated = int(size[alloc].sum())
        requested = int(snap.blk_requested[alloc].sum()) if req_known else None
        releasable = int(self.seg_releasable[seg_mask].sum()) + int(self.blk_releasable[bmask].sum())
        reserved = int(snap.seg_total[seg_mask].sum())
        slivers = bmask & self.sliver
        return {
            "reserved_bytes": reserved,
            "allocated_bytes": allocated,
            "requested_bytes": requested,
            "internal_waste_bytes": (allocated - requested) if requested is not None else None,
            "active_pending_free_bytes": int(size[bmask & self.pending].sum()),
            "inactive_bytes": inactive_bytes,
            "largest_free_block_bytes": largest,
            "external_fragmentation": (round(1.0 - largest / inactive_bytes, 6) if inactive_bytes
                                       else None),
            "releasable_bytes": releasable,
            "non_releasable_inactive_bytes": inactive_bytes - releasable,
            "private_pool_bytes": int(snap.seg_total[seg_mask & self.seg_private].sum()),
            "sliver_count": int(slivers.sum()),
            "sliver_bytes": int(size[slivers].sum()),
            "segments": int(seg_mask.sum()),
            "expandable_segments": int((seg_mask & snap.seg_expandable).sum()),
            "blocks": int(bmask.sum()),
            "free_blocks": int(inact.sum()),
        }


def _ratio(num: int | None, den: int | None) -> float | None:
    if num is None or not den:
        return None
    return round(num / den, 6)


def _fmt_bytes(v: float | None) -> str:
    if v is None:
        return "n/a"
    for u, s in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(v) >= s:
            return f"{v / s:.2f} {u}"
    return f"{int(v)} B"


def _pool_json(p: tuple[int, int]) -> list[int]:
    return [int(p[0]), int(p[1])]


# ---------------------------------------------------------------------------------------------
# Allocator state as per-segment columns, and the OOM replay
def round_request(size: int, divisions: dict | None = None) -> int:
    """The block size the caching allocator gives a ``size``-byte request (``round_size``).

    512-byte multiples, or with ``roundup_power2_divisions`` (``allocator_settings``, keys "1".."32768"
    for the power-of-two intervals from 1 MiB up) the next of N equal steps between two powers of two:
    c10/cuda/CUDACachingAllocator.cpp ``round_size`` / ``roundup_power2_next_division``.
    """
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    div = 0
    if divisions:
        idx = min(max(size.bit_length() - 1 - 20, 0), 15)  # intervals start at 1 MiB (2**20), 16 of them
        v = divisions.get(str(1 << idx), 0)
        div = v if isinstance(v, int) and not isinstance(v, bool) else 0
    if div > 1 and size > K_MIN_BLOCK * div:
        if size & (size - 1) == 0:
            return size
        floor2 = 1 << (size.bit_length() - 1)
        step = floor2 >> (div.bit_length() - 1)
        if step == 0:
            return floor2 << 1
        lo = size & ~(step - 1)
        return size if lo == size else lo + step
    return -(-size // K_MIN_BLOCK) * K_MIN_BLOCK


def _per_seg(snap: Snapshot, values: np.ndarray, op) -> np.ndarray:
    """Reduce a per-block int column per segment with ``op`` (np.add / np.maximum); 0 for empty segments."""
    out = np.zeros(snap.n_segments, np.int64)
    nz = snap.seg_nblocks > 0
    if values.size and nz.any():
        out[nz] = op.reduceat(values.astype(np.int64, copy=False), snap.seg_first_block[nz])
    return out


@dataclass(slots=True)
class _SegState:
    """One allocator state as per-segment columns (bytes): the dump, or an OOM instant after replay.

    ``index`` is the segment's row in the snapshot, -1 for a segment the replay re-created or split.
    ``pool`` indexes ``pools`` (0 is the default pool). ``uncertain_bytes``: free bytes the replay may
    count that were really the unsplit tails of blocks it re-created (an upper bound; 0 at the dump).
    """

    pools: list
    index: np.ndarray
    total: np.ndarray
    stream: np.ndarray
    pool: np.ndarray
    large: np.ndarray
    expandable: np.ndarray
    allocated: np.ndarray
    pending: np.ndarray
    inactive: np.ndarray
    largest: np.ndarray
    releasable: np.ndarray
    free_blocks: np.ndarray
    slivers: np.ndarray
    sliver_bytes: np.ndarray
    uncertain_bytes: int = 0

    _COLS = ("index", "total", "stream", "pool", "large", "expandable", "allocated", "pending", "inactive",
             "largest", "releasable", "free_blocks", "slivers", "sliver_bytes")

    @classmethod
    def from_dump(cls, snap: Snapshot, ar: _Arrays) -> _SegState:
        size = snap.blk_size
        return cls(
            pools=list(snap.pools), index=np.arange(snap.n_segments, dtype=np.int64), total=snap.seg_total,
            stream=snap.seg_stream, pool=snap.seg_pool.astype(np.int64), large=snap.seg_large,
            expandable=snap.seg_expandable,
            allocated=_per_seg(snap, np.where(ar.alloc, size, 0), np.add),
            pending=_per_seg(snap, np.where(ar.pending, size, 0), np.add),
            inactive=_per_seg(snap, np.where(ar.inactive, size, 0), np.add),
            largest=_per_seg(snap, np.where(ar.inactive, size, 0), np.maximum),
            releasable=ar.seg_releasable.astype(np.int64) + _per_seg(snap, ar.blk_releasable, np.add),
            free_blocks=_per_seg(snap, ar.inactive, np.add),
            slivers=_per_seg(snap, ar.sliver, np.add),
            sliver_bytes=_per_seg(snap, np.where(ar.sliver, size, 0), np.add))

    def take(self, rows: np.ndarray) -> _SegState:
        return _SegState(self.pools, *(getattr(self, c)[rows] for c in self._COLS),
                         uncertain_bytes=self.uncertain_bytes)

    def extended(self, rows: list[tuple], pools: list, uncertain: int) -> _SegState:
        """This state plus ``rows`` (tuples in ``_COLS`` order)."""
        cols = []
        for j, c in enumerate(self._COLS):
            old = getattr(self, c)
            cols.append(np.concatenate([old, np.array([r[j] for r in rows], dtype=old.dtype)]) if rows else old)
        return _SegState(pools, *cols, uncertain_bytes=self.uncertain_bytes + uncertain)

    def aggregate(self, mask: np.ndarray | None = None) -> dict:
        """The snapshot numbers over the segments in ``mask`` (same names as :meth:`_Arrays.metrics`)."""
        def pick(col):
            a = getattr(self, col)
            return a if mask is None else a[mask]
        total, inactive = pick("total"), pick("inactive")
        free = int(inactive.sum())
        largest = int(pick("largest").max()) if total.size else 0
        releasable = int(pick("releasable").sum())
        return {
            "reserved_bytes": int(total.sum()),
            "allocated_bytes": int(pick("allocated").sum()),
            "active_pending_free_bytes": int(pick("pending").sum()),
            "inactive_bytes": free,
            "largest_free_block_bytes": largest,
            "external_fragmentation": round(1.0 - largest / free, 6) if free else None,
            "releasable_bytes": releasable,
            "non_releasable_inactive_bytes": free - releasable,
            "private_pool_bytes": int(total[pick("pool") != 0].sum()),
            "sliver_count": int(pick("slivers").sum()),
            "sliver_bytes": int(pick("sliver_bytes").sum()),
            "segments": int(total.size),
            "free_blocks": int(pick("free_blocks").sum()),
        }


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
    state: _SegState | None  # the device's segments at the OOM (None when not complete)


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
    def state(self, dump: _SegState) -> _SegState:
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
                  dump: _SegState | None = None) -> Replay:
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
        dump = _SegState.from_dump(snap, _Arrays(snap, SnapshotConfig()))
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
                sz = f", {_fmt_bytes(size)}" if size is not None else ""
                return Replay(False, done, f"device {oom.device} trace entry #{tail.start + k} ({action}{where}{sz}, "
                                           f"stream {stream}): {why}", r.assumptions(), None)
            done += 1
    return Replay(True, done, None, r.assumptions(), r.state(dump))


# ---------------------------------------------------------------------------------------------
def analyse_snapshot(snap: Snapshot, cfg: SnapshotConfig = SnapshotConfig(), device: int | None = None,
                     device_total_bytes: int | dict[int, int] | None = None
                     ) -> tuple[dict, list[Finding]]:
    """Numbers, OOM classification, verdict and playbook for each device of ``snap``.

    ``device``: only that device. ``device_total_bytes``: GPU memory size (one int for all devices,
    or per device); without it an OOM cannot be blamed on memory held outside PyTorch.
    Returns (the JSON document of docs/snapshot.md, findings ranked most severe first).
    """
    ar = _Arrays(snap, cfg)
    settings = allocator_settings_summary(snap)
    dump = _SegState.from_dump(snap, ar) if snap.ooms else None
    devices = snap.devices()
    if device is not None:
        devices = [d for d in devices if d == device]
    findings: list[Finding] = []
    inconclusive: list[Inconclusive] = []
    dev_docs = []
    for d in devices:
        total_d = device_total_bytes.get(d) if isinstance(device_total_bytes, dict) else device_total_bytes
        doc, fnds, inc = _analyse_device(snap, ar, dump, cfg, d, settings, total_d)
        dev_docs.append(doc)
        findings.extend(fnds)
        inconclusive.extend(inc)
    if not devices:
        inconclusive.append(Inconclusive(
            "memory-snapshot", ["segments"],
            "the snapshot has no segments" + (f" on device {device}" if device is not None else "")
            + " (nothing allocated yet, or backend:cudaMallocAsync, whose snapshots are empty)"))
    verdict = _overall_verdict(dev_docs, inconclusive)
    doc = {
        "kind": "memory-snapshot",
        "source": snap.source,
        "format": {"container": snap.container, "layout": snap.layout, "legacy": snap.legacy,
                   "pool_ids_known": snap.pool_ids_known, "expandable_known": snap.expandable_known},
        "allocator_settings": settings,
        "segment_count": snap.n_segments,
        "block_count": snap.n_blocks,
        "devices": dev_docs,
        "host": host_memory_doc(snap),
        "verdict": verdict,
        "findings": [f.to_dict() for f in rank_findings(findings)],
        "inconclusive": [i.to_dict() for i in inconclusive],
        "playbook": rank_findings(findings)[0].playbook if findings else None,
        "thresholds": {
            "non_releasable_ratio": cfg.non_releasable_ratio,
            "external_fragmentation": cfg.external_fragmentation,
            "min_stranded_bytes": cfg.min_stranded_bytes,
            "sliver_bytes": cfg.sliver_bytes,
            "outside_pytorch_allowance_bytes": cfg.outside_pytorch_allowance_bytes,
        },
        "notes": list(snap.notes),
    }
    return doc, rank_findings(findings)


_VERDICT_RANK = {"inconclusive": 0, "ok": 1, FRAGMENTATION: 2, OOM_CAPACITY: 3, OOM_OUTSIDE_PYTORCH: 3,
                 OOM_MEMORY_CAP: 3, OOM_PRIVATE_POOL: 3, OOM_CROSS_STREAM: 3}


def _overall_verdict(dev_docs: list[dict], inconclusive: list) -> str:
    if not dev_docs:
        return "inconclusive"
    best = max(dev_docs, key=lambda d: (_VERDICT_RANK.get(d["verdict"], 0), bool(d["ooms"])))
    return best["verdict"]


def host_memory_doc(snap: Snapshot) -> dict:
    """The ``host`` section: pinned host memory when the snapshot recorded it (PyTorch >= 2.14)."""
    h = snap.host
    if h is None:
        return {"recorded": False, "segments": None, "blocks": None, "reserved_bytes": None,
                "allocated_bytes": None, "active_pending_free_bytes": None, "inactive_bytes": None,
                "largest_free_block_bytes": None, "trace_entries": None, "trace_actions": {},
                "reason": "no host_segments/host_traces in this snapshot: pinned memory is recorded only by "
                          "PyTorch >= 2.14 with _record_memory_history(record_pinned_host_memory=True); "
                          "torch.cuda.host_memory_stats() reads it live"}
    return {"recorded": True, "segments": h.segments, "blocks": h.blocks, "reserved_bytes": h.reserved_bytes,
            "allocated_bytes": h.allocated_bytes, "active_pending_free_bytes": h.active_pending_free_bytes,
            "inactive_bytes": h.inactive_bytes, "largest_free_block_bytes": h.largest_free_block_bytes,
            "trace_entries": h.trace_entries, "trace_actions": h.trace_actions, "reason": h.problem}


def _analyse_device(snap: Snapshot, ar: _Arrays, dump: _SegState | None, cfg: SnapshotConfig, d: int,
                    settings: dict, device_total: int | None):
    on_dev = snap.seg_device == d
    m = ar.metrics(on_dev)
    m["private_pool_ratio"] = _ratio(m["private_pool_bytes"], m["reserved_bytes"])
    doc: dict = {"device": d, **m}
    pools_doc = []
    for pi in np.unique(snap.seg_pool[on_dev]):
        pm = ar.metrics(on_dev & (snap.seg_pool == pi))
        pid = snap.pools[int(pi)]
        pools_doc.append({"pool_id": _pool_json(pid), "private": pid != DEFAULT_POOL, **pm})
    streams_doc = []
    if on_dev.any():
        keys = np.unique(np.stack([snap.seg_stream[on_dev], snap.seg_pool[on_dev].astype(np.int64)], 1), axis=0)
        for stream, pi in keys:
            sm = ar.metrics(on_dev & (snap.seg_stream == stream) & (snap.seg_pool == pi))
            streams_doc.append({"stream": int(stream), "pool_id": _pool_json(snap.pools[int(pi)]), **sm})
    doc["pools"] = pools_doc
    doc["streams"] = streams_doc
    doc["trace_actions"] = dict(sorted(snap.trace_actions.get(d, {}).items()))

    default = on_dev & (snap.seg_pool == 0)
    dm = ar.metrics(default)
    doc["default_pool"] = {"non_releasable_ratio": _ratio(dm["non_releasable_inactive_bytes"],
                                                          dm["reserved_bytes"]),
                           "external_fragmentation": dm["external_fragmentation"]}

    ooms = [e for e in snap.ooms if e.device == d]
    oom_results = [_oom_doc(snap, dump, cfg, e, settings, device_total) for e in ooms]
    oom_docs = [r[0] for r in oom_results]
    doc["ooms"] = oom_docs

    findings: list[Finding] = []
    inconclusive: list[Inconclusive] = []
    subject = {"gpu": str(d)}
    if not on_dev.any():
        inconclusive.append(Inconclusive(
            "memory-snapshot", ["segments"],
            f"GPU {d}: no segments in the snapshot (trace only); nothing to measure", subject))
    state = _fragmentation_state(snap, dm, cfg, settings, d)
    if oom_docs:
        last, dm_oom = oom_results[-1]
        state_oom = _fragmentation_state(snap, dm_oom, cfg, settings, d)
        findings.append(_oom_finding(snap, d, last, len(oom_docs), dm, dm_oom, state_oom, settings, cfg))
        doc["verdict"] = OOM_CLASSES[last["classification"]]
    elif state["fragmented"]:
        findings.append(_fragmentation_finding(snap, d, dm, state, settings, cfg))
        doc["verdict"] = FRAGMENTATION
    else:
        doc["verdict"] = "ok" if on_dev.any() else "inconclusive"
    doc["fragmentation_checks"] = state["checks"]
    return doc, findings, inconclusive


def _fragmentation_state(snap: Snapshot, dm: dict, cfg: SnapshotConfig, settings: dict, d: int) -> dict:
    """The state rule on the default pool: stranded free bytes that are also scattered."""
    ratio = _ratio(dm["non_releasable_inactive_bytes"], dm["reserved_bytes"])
    ext = dm["external_fragmentation"]
    stranded = dm["non_releasable_inactive_bytes"]
    checks = {
        "non_releasable_ratio": {"observed": ratio, "threshold": cfg.non_releasable_ratio,
                                 "met": ratio is not None and ratio >= cfg.non_releasable_ratio},
        "external_fragmentation": {"observed": ext, "threshold": cfg.external_fragmentation,
                                   "met": ext is not None and ext >= cfg.external_fragmentation},
        "stranded_bytes": {"observed": stranded, "threshold": cfg.min_stranded_bytes,
                           "met": stranded >= cfg.min_stranded_bytes},
    }
    fragmented = all(c["met"] for c in checks.values())
    actions = snap.trace_actions.get(d, {})
    return {"fragmented": fragmented, "checks": checks, "ratio": ratio, "ext": ext, "stranded": stranded,
            "sliver_share": _ratio(dm["sliver_count"], dm["free_blocks"]),
            "segment_frees": actions.get("segment_free", 0) + actions.get("segment_unmap", 0)}


_AT_DUMP_KEYS = ("same_stream_inactive_bytes", "same_stream_largest_free_block_bytes",
                 "other_streams_inactive_bytes", "private_pool_bytes", "reserved_bytes", "allocated_bytes",
                 "outside_pytorch_bytes", "classification")


def _oom_doc(snap: Snapshot, dump: _SegState, cfg: SnapshotConfig, e: OomEvent, settings: dict,
             device_total: int | None) -> tuple[dict, dict]:
    """Classify one OOM on the state at the OOM (replayed) or, if the replay stops, at the dump.

    Returns (the ``ooms[]`` entry, default-pool numbers of the state it was judged on).
    """
    dev_rows = np.flatnonzero(snap.seg_device == e.device)
    at_dump_state = dump.take(dev_rows)
    at_dump = _classify_oom(cfg, e, at_dump_state, device_total)
    rp = replay_to_oom(snap, e, settings, dump)
    if rp.complete:
        st = rp.state
        doc = _classify_oom(cfg, e, st, device_total)
    else:
        st, doc = at_dump_state, dict(at_dump)
    doc.update({
        "state_at": "oom" if rp.complete else "dump",
        "replayed_entries": rp.replayed_entries,
        "replay_problem": rp.problem,
        "replay_uncertain_bytes": st.uncertain_bytes if rp.complete else None,
        "replay_assumptions": rp.assumptions,
        "state_is_stale": (not rp.complete) and e.entries_after > 0,
        "at_dump": {k: at_dump[k] for k in _AT_DUMP_KEYS},
    })
    return doc, st.aggregate(st.pool == 0)


def _classify_oom(cfg: SnapshotConfig, e: OomEvent, st: _SegState, device_total: int | None) -> dict:
    """First match wins: fragmentation, cross-stream, private-pool, memory-cap, outside-pytorch, capacity.

    ``st`` holds the device's segments in the state the OOM is judged on.
    """
    S = e.size_bytes
    if e.pool_id is None:
        pool_idx = 0
    else:  # a pool with no segment in this state has no free space to offer
        pool_idx = st.pools.index(e.pool_id) if e.pool_id in st.pools else -1
    size_class = st.large if S > K_SMALL_SIZE else ~st.large
    in_pool = (st.pool == pool_idx) & size_class
    same = st.aggregate(in_pool & (st.stream == e.stream))
    other = st.aggregate(in_pool & (st.stream != e.stream))
    dev_m = st.aggregate()
    seg_req = alloc_segment_size(S)
    D = e.device_free_bytes
    outside = None
    if device_total is not None and D is not None:
        outside = max(int(device_total) - dev_m["reserved_bytes"] - D, 0)
    numbers = {
        "size_bytes": S,
        "segment_request_bytes": seg_req,
        "stream": e.stream,
        "device_free_bytes": D,
        "time_us": e.time_us,
        "entries_after": e.entries_after,
        "same_stream_inactive_bytes": same["inactive_bytes"],
        "same_stream_largest_free_block_bytes": same["largest_free_block_bytes"],
        "other_streams_inactive_bytes": other["inactive_bytes"],
        "private_pool_bytes": dev_m["private_pool_bytes"],
        "reserved_bytes": dev_m["reserved_bytes"],
        "allocated_bytes": dev_m["allocated_bytes"],
        "device_total_bytes": device_total,
        "outside_pytorch_bytes": outside,
    }
    if same["inactive_bytes"] >= S > same["largest_free_block_bytes"]:
        cls = "fragmentation"
        why = (f"{_fmt_bytes(same['inactive_bytes'])} was free on stream {e.stream} but the largest "
               f"free block was {_fmt_bytes(same['largest_free_block_bytes'])}")
    elif other["inactive_bytes"] >= S:
        cls = "cross-stream"
        why = (f"{_fmt_bytes(other['inactive_bytes'])} was free in blocks cached for other streams, "
               f"which stream {e.stream} cannot use")
    elif pool_idx == 0 and dev_m["private_pool_bytes"] >= S:
        cls = "private-pool"
        why = (f"{_fmt_bytes(dev_m['private_pool_bytes'])} is held by private pools (CUDA graphs / "
               f"MemPool) that ordinary allocations cannot use")
    elif D is not None and D >= seg_req:
        cls = "memory-cap"
        why = (f"the driver still had {_fmt_bytes(D)} free, enough for the {_fmt_bytes(seg_req)} segment: "
               f"the allocator refused under a per-process memory limit")
    elif outside is not None and outside - cfg.outside_pytorch_allowance_bytes >= S:
        cls = "outside-pytorch"
        why = (f"{_fmt_bytes(outside)} of the {_fmt_bytes(device_total)} GPU is held outside PyTorch's "
               f"cache (other processes, NCCL, CUDA context)")
    else:
        cls = "capacity"
        why = (f"allocated {_fmt_bytes(dev_m['allocated_bytes'])} of {_fmt_bytes(dev_m['reserved_bytes'])} "
               f"reserved, no free block or cache to reuse")
    missing = []
    if cls == "capacity" and outside is None:
        missing.append("device_total_bytes" if D is not None else "device_free_bytes")
    return {**numbers, "classification": cls, "diagnosis": OOM_CLASSES[cls], "reason": why,
            "missing": missing}


# ---------------------------------------------------------------------------------------------
def _fragmentation_evidence(dm: dict, state: dict, cfg: SnapshotConfig) -> list[Evidence]:
    ev = [
        Evidence("non_releasable_inactive_ratio", state["ratio"], threshold=cfg.non_releasable_ratio,
                 unit="ratio", agrees=state["checks"]["non_releasable_ratio"]["met"],
                 note="free blocks inside segments that still hold live tensors (default pool); "
                      "empty_cache() cannot return them"),
        Evidence("external_fragmentation", state["ext"], threshold=cfg.external_fragmentation, unit="ratio",
                 agrees=state["checks"]["external_fragmentation"]["met"],
                 note="1 - largest free block / total free"),
        Evidence("non_releasable_inactive_bytes", float(state["stranded"]),
                 threshold=float(cfg.min_stranded_bytes), unit="bytes",
                 agrees=state["checks"]["stranded_bytes"]["met"]),
        Evidence("largest_free_block_bytes", float(dm["largest_free_block_bytes"]), unit="bytes",
                 note=f"of {_fmt_bytes(dm['inactive_bytes'])} free in {dm['free_blocks']} blocks"),
    ]
    if dm["sliver_count"]:
        ev.append(Evidence("sliver_count", float(dm["sliver_count"]), unit="blocks",
                           note=f"free large-pool blocks under {_fmt_bytes(cfg.sliver_bytes)} "
                                f"({_fmt_bytes(dm['sliver_bytes'])} in all)"))
    if state["segment_frees"]:
        ev.append(Evidence("trace_segment_frees", float(state["segment_frees"]), unit="events",
                           note="segment_free/segment_unmap in the trace ring: cache flushes (allocation "
                                "retries) or empty_cache() calls"))
    return ev


def _fragmentation_confidence(state: dict, oom: bool) -> float:
    c = 0.0
    c += 0.3 if state["checks"]["non_releasable_ratio"]["met"] else 0.0
    c += 0.3 if state["checks"]["external_fragmentation"]["met"] else 0.0
    c += 0.1 if (state["sliver_share"] or 0) >= 0.25 else 0.0
    c += 0.1 if state["segment_frees"] else 0.0
    c += 0.3 if oom else 0.0
    return round(min(c, 0.95), 2)


def _fragmentation_finding(snap: Snapshot, d: int, dm: dict, state: dict, settings: dict,
                           cfg: SnapshotConfig) -> Finding:
    summary = (f"GPU {d}: {_fmt_bytes(state['stranded'])} ({state['ratio'] * 100:.1f} %) of "
               f"{_fmt_bytes(dm['reserved_bytes'])} reserved (default pool) is free but stuck in "
               f"{dm['free_blocks']} blocks inside segments that hold live tensors; the largest free block "
               f"is {_fmt_bytes(dm['largest_free_block_bytes'])} (external fragmentation {state['ext']:.2f}); "
               f"empty_cache() could return {_fmt_bytes(dm['releasable_bytes'])}.")
    return Finding(
        id=FRAGMENTATION, severity=Severity.WARNING,
        confidence=_fragmentation_confidence(state, oom=False), summary=summary,
        evidence=_fragmentation_evidence(dm, state, cfg),
        missing=["torch_alloc_retries_total"],  # a retry rate over time would confirm the cost
        subject={"gpu": str(d)}, playbook=snapshot_playbook(FRAGMENTATION, settings, dm),
    )


def _oom_finding(snap: Snapshot, d: int, oom: dict, n_ooms: int, dm_dump: dict, dm: dict, state: dict,
                 settings: dict, cfg: SnapshotConfig) -> Finding:
    """The finding for the last OOM. ``dm``/``state``: default-pool numbers and fragmentation checks of
    the state the OOM was judged on (at the OOM when replayed); ``dm_dump`` feeds the playbook (now)."""
    cls = oom["classification"]
    fid = OOM_CLASSES[cls]
    more = f" ({n_ooms} OOMs in the trace, the last one analysed)" if n_ooms > 1 else ""
    when = ""
    if oom["state_at"] == "oom" and oom["replayed_entries"]:
        when = f" (state at the OOM, rebuilt by undoing the {oom['replayed_entries']} trace entries after it)"
    summary = (f"GPU {d}: out of memory allocating {_fmt_bytes(oom['size_bytes'])} on stream "
               f"{oom['stream']}{more}: {cls.replace('-', ' ')}: {oom['reason']}{when}.")
    ev = [Evidence("oom_request_bytes", float(oom["size_bytes"]), unit="bytes"),
          Evidence("device_free_bytes", None if oom["device_free_bytes"] is None
                   else float(oom["device_free_bytes"]), unit="bytes", note="cudaMemGetInfo at the OOM"),
          Evidence("same_stream_inactive_bytes", float(oom["same_stream_inactive_bytes"]), unit="bytes"),
          Evidence("same_stream_largest_free_block_bytes", float(oom["same_stream_largest_free_block_bytes"]),
                   unit="bytes"),
          Evidence("reserved_bytes", float(oom["reserved_bytes"]), unit="bytes"),
          Evidence("allocated_bytes", float(oom["allocated_bytes"]), unit="bytes")]
    if cls == "cross-stream":
        ev.append(Evidence("other_streams_inactive_bytes", float(oom["other_streams_inactive_bytes"]),
                           unit="bytes"))
    if cls == "private-pool":
        ev.append(Evidence("private_pool_bytes", float(oom["private_pool_bytes"]), unit="bytes"))
    if cls == "outside-pytorch":
        ev.append(Evidence("outside_pytorch_bytes", float(oom["outside_pytorch_bytes"]), unit="bytes",
                           threshold=float(cfg.outside_pytorch_allowance_bytes)))
    if cls == "fragmentation":
        ev.extend(_fragmentation_evidence(dm, state, cfg))
        conf = _fragmentation_confidence(state, oom=True)
    else:
        conf = 0.8 if not oom["missing"] else 0.5
    if oom["state_at"] == "oom" and oom["replayed_entries"]:
        dump_cls = oom["at_dump"]["classification"]
        ev.append(Evidence("trace_entries_undone", float(oom["replayed_entries"]), unit="entries",
                           note="state rebuilt at the OOM" + (f"; the dump-time state alone reads {dump_cls}"
                                                              if dump_cls != cls else "")))
    unc = oom["replay_uncertain_bytes"] or 0
    free_used = {"fragmentation": oom["same_stream_inactive_bytes"],
                 "cross-stream": oom["other_streams_inactive_bytes"]}.get(cls)
    if unc and free_used is not None and free_used - unc < oom["size_bytes"]:
        # the class rests on free bytes the replay may have over-counted (unsplit block tails)
        conf = round(conf * 0.8, 2)
        ev.append(Evidence("replay_uncertain_bytes", float(unc), unit="bytes", agrees=False,
                           note="free bytes that may be unsplit tails of blocks the replay re-created; "
                                "without them the free space would not cover the request"))
    if oom["state_is_stale"]:
        conf = round(conf * 0.7, 2)
        ev.append(Evidence("trace_entries_after_oom", float(oom["entries_after"]), unit="entries",
                           agrees=False, note="judged on the dump-time state, which is later than the OOM: "
                                              f"{oom['replay_problem']}"))
    onset = oom["time_us"] / 1e6 if oom["time_us"] and 1.4e15 < oom["time_us"] < 4.1e15 else None
    return Finding(id=fid, severity=Severity.CRITICAL, confidence=conf, summary=summary, onset=onset,
                   evidence=ev, missing=list(oom["missing"]), subject={"gpu": str(d)},
                   playbook=snapshot_playbook(fid, settings, dm_dump, oom))


# ---------------------------------------------------------------------------------------------
# Playbook: PYTORCH_CUDA_ALLOC_CONF changes with their preconditions and contraindications
def _pow2_floor(x: float) -> int:
    return 1 << int(math.floor(math.log2(x))) if x >= 1 else 0


def snapshot_playbook(diagnosis: str, settings: dict, dm: dict, oom: dict | None = None) -> dict:
    """Playbook for a snapshot diagnosis, with actions computed from the numbers and settings."""
    backend = settings.get("backend")
    async_backend = backend == "cudaMallocAsync"
    exp_on = settings.get("expandable_segments") is True
    options: list[dict] = []
    immediate: list[str] = []
    actions: list[str] = []
    if async_backend:
        immediate.append("backend:cudaMallocAsync is in effect: the caching-allocator knobs below are ignored; "
                         "switch to the native backend before tuning them")
    if diagnosis in (FRAGMENTATION, OOM_CROSS_STREAM):
        options.append({
            "setting": "expandable_segments:True",
            "env": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "applies": not exp_on and not async_backend,
            "status": "already on" if exp_on else ("ignored by backend:cudaMallocAsync" if async_backend
                                                  else "recommended first"),
            "why": "one growable segment per stream (virtual-memory mapping): sizes that change a little "
                   "(batch N -> N+1) no longer leave slivers at segment ends, and free pages can be unmapped",
            "preconditions": [
                "PyTorch >= 2.1 with the native allocator; restart the process to apply",
                "set it in PYTORCH_CUDA_ALLOC_CONF (PyTorch 2.9.1 silently ignored it under the newer "
                "PYTORCH_ALLOC_CONF name, pytorch/pytorch#183387) and check that the next snapshot shows "
                "allocator_settings.expandable_segments = true (some builds refuse it, pytorch/pytorch#122057)",
            ],
            "contraindications": [
                "vLLM custom all-reduce at tensor parallel >= 2: the IPC export rejects VMM memory and the "
                "worker dies with custom_all_reduce.cuh 'invalid argument' (vllm-project/vllm#9046, #42609); "
                "use --disable-custom-all-reduce or leave it off",
                "vLLM sleep mode (CuMemAllocator memory pool): sleep freed nothing / asserted "
                "(pytorch/pytorch#147851, vllm-project/vllm#14189); newer vLLM toggles it off inside the pool",
                "with it on, the inactive_split_bytes statistic no longer counts expandable-segment blocks "
                "(pytorch/pytorch#159564): watch fragmentation with snapshots, not that gauge",
                "ignored by backend:cudaMallocAsync",
            ],
        })
    if diagnosis == FRAGMENTATION:
        target = None
        if oom is not None:
            target = oom["size_bytes"]
        elif dm.get("largest_free_block_bytes"):
            target = dm["largest_free_block_bytes"]
        mb = _pow2_floor(target / MiB) if target else 0
        cur = settings.get("max_split_size_bytes")
        ok = mb > 20 and not async_backend
        options.append({
            "setting": f"max_split_size_mb:{max(mb, 32)}",
            "env": f"PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{max(mb, 32)}",
            "applies": ok and (cur is None or cur > mb * MiB),
            "status": ("already set to " + _fmt_bytes(cur)) if cur is not None else
                      ("starting value: the largest power of two at or below the failing request / largest "
                       "free block" if ok else "not applicable: requests here are too small (must be > 20 MiB)"),
            "why": "blocks this large or larger are never split, so small requests cannot shatter them; "
                   "PyTorch's docs keep it as a last resort for OOMs with many inactive split blocks",
            "preconditions": ["native allocator", "fragmentation involves blocks larger than 20 MiB "
                              "(the value must be > 20)"],
            "contraindications": [
                "can cost performance: large requests can no longer reuse bigger cached blocks, so there are "
                "more cudaMalloc/cudaFree calls; compare throughput before and after",
                "redundant once expandable_segments:True works", "ignored by backend:cudaMallocAsync",
            ],
        })
        options.append({
            "setting": "garbage_collection_threshold:0.8",
            "env": "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8",
            # None: depends on a per-process memory fraction, which a snapshot does not record
            "applies": (False if async_backend or (settings.get("garbage_collection_threshold") or 0) > 0
                        else None),
            "status": ("already set" if (settings.get("garbage_collection_threshold") or 0) > 0
                       else "only with a per-process memory fraction"),
            "why": "frees old unused cached blocks before the allocator reaches the flush-everything retry "
                   "(device sync, latency spike); PyTorch's docs name servers as the target",
            "preconditions": [
                "torch.cuda.set_per_process_memory_fraction() is set: the collector runs only under a "
                "memory fraction (CUDACachingAllocator: garbage_collect_cached_blocks behind set_fraction; "
                "pytorch/pytorch#74261)", "value in (0, 1)"],
            "contraindications": [
                "does nothing for free blocks inside partly used segments (they are not releasable)",
                "ignored by backend:cudaMallocAsync",
            ],
        })
        if dm.get("releasable_bytes"):
            immediate.append(f"torch.cuda.empty_cache() would return {_fmt_bytes(dm['releasable_bytes'])} to "
                             f"the driver, but not the {_fmt_bytes(dm.get('non_releasable_inactive_bytes'))} "
                             f"stuck beside live tensors")
    if diagnosis == OOM_CROSS_STREAM:
        actions.append("free blocks are cached per stream: allocate on the stream that frees, or call "
                       "tensor.record_stream() only where needed; torch.cuda.empty_cache() after a side-stream "
                       "phase returns whole free segments")
    if diagnosis == OOM_PRIVATE_POOL:
        actions.append("CUDA-graph / MemPool private pools keep their memory while the graph or pool lives: "
                       "capture fewer batch sizes (vLLM: fewer cudagraph capture sizes or a lower "
                       "--max-num-seqs; --enforce-eager to confirm), share one pool between graphs, or "
                       "delete unused graphs / pools")
    if diagnosis == OOM_MEMORY_CAP:
        actions.append("the driver had room but the allocator refused: check "
                       "torch.cuda.set_per_process_memory_fraction() (and the engine's memory budget, e.g. "
                       "vLLM --gpu-memory-utilization) against what this process needs")
    if diagnosis == OOM_OUTSIDE_PYTORCH:
        actions.append("memory is held outside this process's PyTorch cache: list GPU processes "
                       "(nvidia-smi --query-compute-apps=pid,used_memory --format=csv), check NCCL buffers "
                       "and other tenants; lower vLLM --gpu-memory-utilization or move the other tenant")
    if diagnosis == OOM_CAPACITY:
        actions.append("the workload needs more memory than the GPU has: lower the batch "
                       "(vLLM --max-num-seqs / --max-num-batched-tokens) or context length (--max-model-len), "
                       "quantize weights or KV cache, or shard over more GPUs")
        actions.append("allocator settings will not help: allocated is close to reserved")
    for o in options:
        if o["applies"] is True:
            actions.append(f"set {o['env']} (not if: {o['contraindications'][0]})")
    return {"diagnosis": diagnosis, "immediate": immediate, "actions": actions, "options": options}


# ---------------------------------------------------------------------------------------------
# Per-segment map (our take on _memory_viz segsum): one line per segment, one character per slice
MAP_CHARS = {"allocated": "#", "waste": "+", "pending": "~", "free": ".", "mixed": ":"}
_MAP_ORDER = ("allocated", "waste", "pending", "free")


def segment_map_rows(snap: Snapshot, device: int | None = None, limit: int | None = 40,
                     width: int = 48) -> tuple[list[dict], int]:
    """Rows for the segment map, most free bytes first (then shown in address order).

    Each cell covers total_size / width bytes and shows the state holding most of it: ``#`` allocated
    (requested bytes), ``+`` rounding waste, ``~`` freed but pending on a stream event, ``.`` free; ``:``
    when used and free bytes each cover at least a quarter of the cell. Returns (rows, segments in scope).
    """
    nseg = snap.n_segments
    scope = np.ones(nseg, bool) if device is None else snap.seg_device == device
    idx = np.flatnonzero(scope)
    if idx.size == 0:
        return [], 0
    seg = snap.blk_seg
    inact = snap.blk_state == INACTIVE
    free_per_seg = np.bincount(seg, weights=np.where(inact, snap.blk_size, 0), minlength=nseg)
    nfree_per_seg = np.bincount(seg, weights=inact, minlength=nseg)
    chosen = idx[np.argsort(-free_per_seg[idx], kind="stable")]
    if limit:
        chosen = chosen[:limit]
    chosen = chosen[np.lexsort((snap.seg_address[chosen], snap.seg_stream[chosen], snap.seg_pool[chosen],
                                snap.seg_device[chosen]))]
    rows = []
    for j in chosen:
        lo = int(snap.seg_first_block[j])
        hi = lo + int(snap.seg_nblocks[j])
        total = int(snap.seg_total[j])
        sizes = snap.blk_size[lo:hi]
        states = snap.blk_state[lo:hi]
        req = snap.blk_requested[lo:hi]
        free_sizes = sizes[states == INACTIVE]
        rows.append({
            "device": int(snap.seg_device[j]), "address": int(snap.seg_address[j]), "total_size": total,
            "stream": int(snap.seg_stream[j]), "pool_id": _pool_json(snap.pools[int(snap.seg_pool[j])]),
            "segment_type": "large" if snap.seg_large[j] else "small",
            "is_expandable": bool(snap.seg_expandable[j]),
            "allocated_bytes": int(sizes[states == ALLOCATED].sum()),
            "inactive_bytes": int(free_per_seg[j]), "free_blocks": int(nfree_per_seg[j]),
            "largest_free_block_bytes": int(free_sizes.max()) if free_sizes.size else 0,
            "blocks": hi - lo,
            "map": _segment_bar(sizes, states, req, total, width),
        })
    return rows, int(idx.size)


def _segment_bar(sizes: np.ndarray, states: np.ndarray, req: np.ndarray, total: int, width: int) -> str:
    if total <= 0 or sizes.size == 0:
        return " " * width
    alloc = states == ALLOCATED
    used = np.where(alloc & (req >= 0), np.minimum(req, sizes), sizes)  # requested part of each block
    rest = sizes - used  # rounding waste (allocated blocks only)
    # two pieces per block: [used | rest]; categories per piece
    lengths = np.stack([used, rest], 1).ravel().astype(np.float64)
    cat_used = np.where(alloc, 0, np.where(states == PENDING_FREE, 2, 3))
    cats = np.stack([cat_used, np.where(alloc, 1, cat_used)], 1).ravel()
    pts = np.concatenate([[0.0], np.cumsum(lengths)])
    edges = np.linspace(0.0, float(total), width + 1)
    cover = np.empty((4, width))
    for c in range(4):
        f = np.concatenate([[0.0], np.cumsum(np.where(cats == c, lengths, 0.0))])
        cover[c] = np.diff(np.interp(edges, pts, f))
    cell = total / width
    best = cover.argmax(0)
    out = []
    for k in range(width):
        used_b = cover[0, k] + cover[1, k] + cover[2, k]
        if cover[:, k].sum() <= 0:
            out.append(" ")
        elif used_b >= cell / 4 and cover[3, k] >= cell / 4:
            out.append(MAP_CHARS["mixed"])
        else:
            out.append(MAP_CHARS[_MAP_ORDER[int(best[k])]])
    return "".join(out)


# ---------------------------------------------------------------------------------------------
def analyse_snapshot_obj(obj: object, source: str = "snapshot", **kw) -> tuple[dict, list[Finding]]:
    """Analyse an in-memory snapshot (what ``torch.cuda.memory._snapshot()`` returned)."""
    return analyse_snapshot(parse_snapshot(obj, source=source), **kw)


def analyse_snapshot_file(path: str, **kw) -> tuple[dict, list[Finding]]:
    """Read and analyse a snapshot file; raises ``SnapshotError`` (one line) on bad input.

    The entry point for the agent's capture feature and the CLI. Keyword arguments go to
    :func:`analyse_snapshot` (cfg, device, device_total_bytes).
    """
    return analyse_snapshot(read_snapshot(path), **kw)


__all__ = ["segment_map_rows", "MAP_CHARS", "analyse_snapshot", "analyse_snapshot_file", "analyse_snapshot_obj",
           "snapshot_playbook", "SnapshotConfig", "alloc_segment_size", "round_request", "replay_to_oom", "Replay",
           "host_memory_doc", "DIAGNOSIS_IDS", "OOM_CLASSES"]
