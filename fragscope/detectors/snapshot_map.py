"""The text segment map (our take on ``_memory_viz segsum``): one row per segment, one character per slice.

Pure: rows of plain data from a :class:`~fragscope.collectors.snapshot.Snapshot`; the CLI prints them.
Legend and contract: docs/snapshot.md ("Segment map").
"""
from __future__ import annotations

import numpy as np

from ..collectors.snapshot import ALLOCATED, INACTIVE, PENDING_FREE, Snapshot
from .snapshot_state import pool_json

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
            "stream": int(snap.seg_stream[j]), "pool_id": pool_json(snap.pools[int(snap.seg_pool[j])]),
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



__all__ = ["MAP_CHARS", "segment_map_rows"]
