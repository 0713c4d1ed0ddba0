"""A snapshot's allocator state as columns: per-block helper columns and per-segment aggregates.

:class:`BlockColumns` derives the per-block facts once (free, allocated, slivers, releasable bytes);
:class:`SegState` holds one allocator state per segment (the dump, or an OOM instant after the replay
in :mod:`.snapshot_replay`) and aggregates it. :class:`SnapshotConfig` holds the analysis thresholds.
Pure: numpy over a :class:`~fragscope.collectors.snapshot.Snapshot`. Definitions: docs/snapshot.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..collectors.snapshot import ALLOCATED, INACTIVE, PENDING_FREE, Snapshot
from .snapshot_allocator import GiB, K_LARGE_BUFFER, K_ROUND_LARGE, K_SMALL_BUFFER, MiB

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


class BlockColumns:
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


def ratio(num: int | None, den: int | None) -> float | None:
    if num is None or not den:
        return None
    return round(num / den, 6)



def pool_json(p: tuple[int, int]) -> list[int]:
    return [int(p[0]), int(p[1])]


def per_seg(snap: Snapshot, values: np.ndarray, op) -> np.ndarray:
    """Reduce a per-block int column per segment with ``op`` (np.add / np.maximum); 0 for empty segments."""
    out = np.zeros(snap.n_segments, np.int64)
    nz = snap.seg_nblocks > 0
    if values.size and nz.any():
        out[nz] = op.reduceat(values.astype(np.int64, copy=False), snap.seg_first_block[nz])
    return out


@dataclass(slots=True)
class SegState:
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
    def from_dump(cls, snap: Snapshot, ar: BlockColumns) -> SegState:
        size = snap.blk_size
        return cls(
            pools=list(snap.pools), index=np.arange(snap.n_segments, dtype=np.int64), total=snap.seg_total,
            stream=snap.seg_stream, pool=snap.seg_pool.astype(np.int64), large=snap.seg_large,
            expandable=snap.seg_expandable,
            allocated=per_seg(snap, np.where(ar.alloc, size, 0), np.add),
            pending=per_seg(snap, np.where(ar.pending, size, 0), np.add),
            inactive=per_seg(snap, np.where(ar.inactive, size, 0), np.add),
            largest=per_seg(snap, np.where(ar.inactive, size, 0), np.maximum),
            releasable=ar.seg_releasable.astype(np.int64) + per_seg(snap, ar.blk_releasable, np.add),
            free_blocks=per_seg(snap, ar.inactive, np.add),
            slivers=per_seg(snap, ar.sliver, np.add),
            sliver_bytes=per_seg(snap, np.where(ar.sliver, size, 0), np.add))

    def take(self, rows: np.ndarray) -> SegState:
        return SegState(self.pools, *(getattr(self, c)[rows] for c in self._COLS),
                         uncertain_bytes=self.uncertain_bytes)

    def extended(self, rows: list[tuple], pools: list, uncertain: int) -> SegState:
        """This state plus ``rows`` (tuples in ``_COLS`` order)."""
        cols = []
        for j, c in enumerate(self._COLS):
            old = getattr(self, c)
            cols.append(np.concatenate([old, np.array([r[j] for r in rows], dtype=old.dtype)]) if rows else old)
        return SegState(pools, *cols, uncertain_bytes=self.uncertain_bytes + uncertain)

    def aggregate(self, mask: np.ndarray | None = None) -> dict:
        """The snapshot numbers over the segments in ``mask`` (same names as :meth:`BlockColumns.metrics`)."""
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


__all__ = ["SnapshotConfig", "BlockColumns", "SegState", "per_seg", "ratio", "pool_json"]
