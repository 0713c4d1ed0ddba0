"""PyTorch CUDA caching-allocator memory snapshots: the columnar model and normalisation.

Reads what ``torch.cuda.memory._snapshot()`` / ``_dump_snapshot(path)`` write (a pickled dict with
``segments``, ``device_traces``, ``allocator_settings``), the bare segment list of
``torch.cuda.memory_snapshot()``, legacy (PyTorch ~2.0) snapshots whose blocks carry
``history: [{addr, real_size, frames}]``, and the same structures saved as JSON. gzip is accepted.
Formats: docs/snapshot.md; field notes: ../shared/notes/formats-and-analyses.md section 2. Bytes to
objects (safe unpickling, size and memory caps): :mod:`fragscope.collectors.snapshot_load`.

Besides the segment state, the loader keeps each device's trace entries from its first ``oom`` entry on
(:class:`TraceTail`), which is what the OOM replay in ``fragscope.detectors.snapshot_replay`` undoes, and
the pinned-host data PyTorch 2.14 adds (``host_segments`` / ``host_traces``, :class:`HostMemory`).

Limits: a file may claim at most ``size / 8 + 10,000`` blocks (shared references would otherwise let a
tiny file describe billions); numbers that do not fit in 64 bits, NaN and infinities are refused or
read as absent, so nothing downstream sees them.
"""
from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field

import numpy as np

from .snapshot_load import (  # noqa: F401 - re-exported: the file entry point's limits and errors
    LOAD_MEMORY_FACTOR,
    MAX_BYTES_ENV,
    MAX_SNAPSHOT_BYTES,
    SnapshotError,
    estimate_load_bytes,
    load_snapshot_bytes,
    read_regular_file,
)
from .snapshot_load import i64, label
from .snapshot_job import snapshot_job
from .snapshot_settings import allocator_settings_summary, parse_alloc_conf  # noqa: F401 - re-exported


# block states, as small ints in Snapshot.blk_state
INACTIVE, ALLOCATED, PENDING_FREE = 0, 1, 2
_STATES = {
    "inactive": INACTIVE,
    "active_allocated": ALLOCATED,
    "active_pending_free": PENDING_FREE,  # what the C++ emits
    "active_awaiting_free": PENDING_FREE,  # what the _snapshot() docstring says
}
STATE_NAMES = {INACTIVE: "inactive", ALLOCATED: "active_allocated", PENDING_FREE: "active_pending_free"}

DEFAULT_POOL = (0, 0)


@dataclass(frozen=True, slots=True)
class OomEvent:
    """One ``oom`` trace entry: the allocator could not satisfy ``size_bytes`` on ``stream``."""

    device: int
    size_bytes: int  # rounded request size
    stream: int
    device_free_bytes: int | None  # cudaMemGetInfo free at the failure
    time_us: int | None
    entries_after: int  # trace entries recorded after this one (snapshot state is later than the OOM)
    pool_id: tuple[int, int] | None = None
    trace_index: int | None = None  # position of the entry in its device trace


@dataclass(frozen=True, slots=True)
class TraceTail:
    """One device's trace entries from its first ``oom`` entry to the end of the ring.

    ``entries[k]`` is ``(action, addr, size, stream, pool_id)`` for trace position ``start + k``;
    ``addr``/``size`` are None where the entry does not hold an integer, ``pool_id`` where it has none
    (most PyTorch versions do not write one on trace entries).
    """

    start: int
    entries: list[tuple[str, int | None, int | None, int, tuple[int, int] | None]]


@dataclass(frozen=True, slots=True)
class HostMemory:
    """Pinned host memory (CachingHostAllocator) from ``host_segments`` / ``host_traces``.

    PyTorch 2.14 adds these keys when ``_record_memory_history(record_pinned_host_memory=True)`` was on
    (pytorch/pytorch#182407). Their entries are read only if they have the device segment layout
    (``total_size`` plus ``blocks`` of ``size``/``state``), which that PR builds them with; anything
    else leaves the byte counts None with ``problem`` saying why. Sizes in bytes.
    """

    segments: int
    blocks: int
    reserved_bytes: int | None
    allocated_bytes: int | None
    active_pending_free_bytes: int | None
    inactive_bytes: int | None
    largest_free_block_bytes: int | None
    trace_entries: int
    trace_actions: dict[str, int]
    problem: str | None = None


@dataclass(slots=True)
class Snapshot:
    """A snapshot as columns: one row per segment, one row per block (blocks grouped by segment).

    All sizes in bytes (int64). ``blk_requested`` is -1 where the file does not say.
    """

    source: str
    container: str  # pickle | pickle.gz | json | json.gz | object
    layout: str  # dump (dict with segments) | segment-list (memory_snapshot())
    legacy: bool  # blocks carry history/real_size (PyTorch ~2.0)
    seg_device: np.ndarray
    seg_address: np.ndarray
    seg_total: np.ndarray
    seg_stream: np.ndarray
    seg_pool: np.ndarray  # index into ``pools``
    seg_large: np.ndarray  # bool: segment_type == 'large'
    seg_expandable: np.ndarray  # bool
    seg_first_block: np.ndarray
    seg_nblocks: np.ndarray
    blk_seg: np.ndarray
    blk_offset: np.ndarray  # offset from segment base
    blk_size: np.ndarray
    blk_requested: np.ndarray
    blk_state: np.ndarray  # int8: INACTIVE / ALLOCATED / PENDING_FREE
    pools: list[tuple[int, int]]
    pool_ids_known: bool  # False for snapshots without segment_pool_id (legacy)
    expandable_known: bool  # False for snapshots without is_expandable
    allocator_settings: dict | None
    devices_traced: list[int]
    trace_actions: dict[int, dict[str, int]]
    ooms: list[OomEvent]
    notes: list[str] = field(default_factory=list)
    trace_tails: dict[int, TraceTail] = field(default_factory=dict)  # device -> entries from its first OOM
    host: HostMemory | None = None  # None: the snapshot has no host_segments/host_traces keys
    job: dict | None = None  # what produced it, from its stack frames (collectors/snapshot_job.py); None: not read

    @property
    def n_segments(self) -> int:
        return int(self.seg_total.size)

    @property
    def n_blocks(self) -> int:
        return int(self.blk_size.size)

    def devices(self) -> list[int]:
        return sorted({int(d) for d in np.unique(self.seg_device)} | set(self.devices_traced))


# ---------------------------------------------------------------------------------------------
# loading bytes
def read_snapshot(path: str, max_bytes: int = MAX_SNAPSHOT_BYTES) -> Snapshot:
    """Load and normalise a snapshot file (pickle or JSON, optionally gzip). Raises SnapshotError."""
    name = str(path)
    data = read_regular_file(path, max_bytes, what="a memory snapshot")
    obj, container = load_snapshot_bytes(data, name, max_bytes)
    return parse_snapshot(obj, source=name, container=container, file_bytes=len(data))




# ---------------------------------------------------------------------------------------------
# normalising
def _int(v, what: str, name: str) -> int:
    if v is None:
        raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot ({what} is missing)")
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot ({what} is "
                            f"{type(v).__name__}, expected an integer)")
    return v


def _pool_id(v, name: str) -> tuple[int, int]:
    if v is None:
        return DEFAULT_POOL
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(i64(x) is not None for x in v):
        return (int(v[0]), int(v[1]))
    raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot (segment_pool_id {label(v)} "
                        f"is not a pair of integers)")


def parse_snapshot(obj: object, source: str = "snapshot", container: str = "object",
                   file_bytes: int | None = None) -> Snapshot:
    """Normalise a loaded snapshot (dict from ``_snapshot()`` or list from ``memory_snapshot()``)."""
    # Normalising creates no reference cycles, but its allocations (the trace tail kept for the OOM
    # replay) can set off a full collection over the just-unpickled heap: on the bench snapshot the
    # trace pass takes 245 ms with the collector running and 29 ms with it paused.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse_snapshot(obj, source, container, file_bytes)
    finally:
        if was_enabled:
            gc.enable()


def _parse_snapshot(obj: object, source: str, container: str, file_bytes: int | None) -> Snapshot:
    name = source
    if isinstance(obj, dict):
        if "segments" not in obj:
            keys = ", ".join(sorted(label(k) for k in list(obj)[:8]))
            raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot (no 'segments' key; "
                                f"top-level keys: {keys or 'none'})")
        segments = obj["segments"]
        traces = obj.get("device_traces") or []
        settings = obj.get("allocator_settings")
        layout = "dump"
        has_host = "host_segments" in obj or "host_traces" in obj
    elif isinstance(obj, list):
        segments, traces, settings, layout = obj, [], None, "segment-list"
        has_host = False
    else:
        raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot (top level is "
                            f"{type(obj).__name__}, expected a dict or a list of segments)")
    if not isinstance(segments, list):
        raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot ('segments' is "
                            f"{type(segments).__name__}, expected a list)")
    if settings is not None and not isinstance(settings, dict):
        settings = None
    if not isinstance(traces, list):
        traces = []

    # bound the work a file can ask for: shared references let a small pickle describe huge lists
    n_claimed = 0
    for s in segments:
        if not isinstance(s, dict):
            raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot (a segment is "
                                f"{type(s).__name__}, expected a dict with a 'blocks' list)")
        if not isinstance(s.get("blocks", []), list):
            raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot (a segment's 'blocks' "
                                f"is {type(s['blocks']).__name__}, expected a list)")
        n_claimed += len(s.get("blocks", ()))
    host_segments = obj.get("host_segments") if has_host else None
    if isinstance(host_segments, list):
        n_claimed += sum(len(h["blocks"]) for h in host_segments
                         if isinstance(h, dict) and isinstance(h.get("blocks"), list))
    limit = (file_bytes // 8 + 10_000) if file_bytes is not None else 50_000_000
    if n_claimed > limit:
        raise SnapshotError(f"refusing to analyse {name}: {n_claimed} blocks claimed by a "
                            f"{file_bytes}-byte file (shared references, not a real snapshot)")

    nseg = len(segments)
    seg_device = np.empty(nseg, np.int64)
    seg_address = np.empty(nseg, np.int64)
    seg_total = np.empty(nseg, np.int64)
    seg_stream = np.empty(nseg, np.int64)
    seg_pool = np.empty(nseg, np.int32)
    seg_large = np.empty(nseg, bool)
    seg_exp = np.zeros(nseg, bool)
    seg_nblocks = np.empty(nseg, np.int64)
    sizes: list[int] = []
    reqs: list[int] = []
    states: list[int] = []
    pools: dict[tuple[int, int], int] = {DEFAULT_POOL: 0}
    legacy = False
    pool_known = expandable_known = nseg > 0
    unknown_states: dict[str, int] = {}
    size_mismatch = 0
    states_get = _STATES.get
    try:
        for i, s in enumerate(segments):
            blocks = s.get("blocks", [])
            seg_device[i] = _int(s.get("device", 0), "segment device", name)
            seg_address[i] = _int(s.get("address", 0), "segment address", name)
            total = seg_total[i] = _int(s.get("total_size"), "segment total_size", name)
            seg_stream[i] = _int(s.get("stream", 0), "segment stream", name)
            if "segment_pool_id" in s:
                pid = _pool_id(s["segment_pool_id"], name)
            else:
                pid, pool_known = DEFAULT_POOL, False
            seg_pool[i] = pools.setdefault(pid, len(pools))
            seg_large[i] = s.get("segment_type", "large") != "small"
            if "is_expandable" in s:
                seg_exp[i] = bool(s["is_expandable"])
            else:
                expandable_known = False
            seg_nblocks[i] = len(blocks)
            bsum = 0
            for b in blocks:
                size = b["size"]
                st = states_get(b["state"])
                if st is None:
                    st_name = label(b["state"])
                    unknown_states[st_name] = unknown_states.get(st_name, 0) + 1
                    st = INACTIVE if "inactive" in st_name else ALLOCATED
                req = b.get("requested_size")
                if "history" in b:
                    legacy = True
                    if req is None:
                        hist = b["history"]
                        req = min(sum(h["real_size"] for h in hist), size) if hist else None
                if req is None or st != ALLOCATED:
                    req = -1 if req is None else req
                sizes.append(size)
                reqs.append(req)
                states.append(st)
                bsum += size
            if blocks and bsum != total:
                size_mismatch += 1
    except SnapshotError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        what = (f"missing key {label(e.args[0])!r}" if isinstance(e, KeyError)
                else f"a field has the wrong type: {str(e).splitlines()[0]}")
        raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot (a segment or block is "
                            f"malformed: {what})") from None
    except OverflowError:
        raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot (an address or size does "
                            f"not fit in 64 bits)") from None
    try:
        blk_size = np.array(sizes, dtype=np.int64)
        blk_req = np.array(reqs, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot (a block size is not an "
                            f"integer that fits in 64 bits)") from None
    blk_state = np.array(states, dtype=np.int8)
    if (blk_size < 0).any() or (seg_total < 0).any():
        raise SnapshotError(f"cannot read {name}: not a PyTorch memory snapshot (negative size)")
    first = np.zeros(nseg, np.int64)
    if nseg > 1:
        np.cumsum(seg_nblocks[:-1], out=first[1:])
    blk_seg = np.repeat(np.arange(nseg, dtype=np.int32), seg_nblocks)
    # offset of each block from its segment base: running sum of sizes, restarted per segment
    excl = np.zeros(blk_size.size + 1, np.int64)  # exclusive prefix sum of block sizes
    np.cumsum(blk_size, out=excl[1:])
    blk_offset = excl[:-1] - np.repeat(excl[first], seg_nblocks)

    notes: list[str] = []
    if unknown_states:
        notes.append("unknown block states counted by name: "
                     + ", ".join(f"{k} ({v})" for k, v in sorted(unknown_states.items())))
    if size_mismatch:
        notes.append(f"{size_mismatch} segment(s) whose block sizes do not add up to total_size")
    if nseg and not pool_known:
        notes.append("no segment_pool_id in this snapshot (older PyTorch): private pools cannot be told apart")
    alloc_req = blk_req[blk_state == ALLOCATED]
    if alloc_req.size and (alloc_req < 0).any():
        notes.append("some allocated blocks have no requested size: requested bytes are not available")

    trace_actions, ooms, devices_traced, tails = _parse_traces(traces, name)
    n_oom_entries = sum(c.get("oom", 0) for c in trace_actions.values())
    if n_oom_entries > len(ooms):
        notes.append(f"{n_oom_entries - len(ooms)} oom trace entr{'y' if n_oom_entries - len(ooms) == 1 else 'ies'} "
                     f"without a readable size (an integer from 0 to 2**63) not analysed")
    host = _parse_host(host_segments, obj.get("host_traces")) if has_host else None
    job = snapshot_job(obj, [(o.device, o.trace_index) for o in ooms])
    return Snapshot(
        source=source, container=container, layout=layout, legacy=legacy,
        seg_device=seg_device, seg_address=seg_address, seg_total=seg_total, seg_stream=seg_stream,
        seg_pool=seg_pool, seg_large=seg_large, seg_expandable=seg_exp, seg_first_block=first,
        seg_nblocks=seg_nblocks, blk_seg=blk_seg, blk_offset=blk_offset, blk_size=blk_size,
        blk_requested=blk_req, blk_state=blk_state, pools=list(pools), pool_ids_known=pool_known,
        expandable_known=expandable_known, allocator_settings=settings, devices_traced=devices_traced,
        trace_actions=trace_actions, ooms=ooms, notes=notes, trace_tails=tails, host=host, job=job)


def _parse_traces(traces: list, name: str) -> tuple[dict[int, dict[str, int]], list[OomEvent], list[int],
                                                   dict[int, TraceTail]]:
    actions: dict[int, dict[str, int]] = {}
    ooms: list[OomEvent] = []
    traced: list[int] = []
    tails: dict[int, TraceTail] = {}
    for dev, trace in enumerate(traces):
        if not isinstance(trace, list):
            continue
        if trace:
            traced.append(dev)
        counts: dict[str, int] = {}
        n = len(trace)
        tail: list | None = None
        for i, e in enumerate(trace):
            if not isinstance(e, dict):
                if tail is not None:
                    tail.append(("?", None, None, 0, None))
                continue
            a = label(e.get("action", "?"))
            counts[a] = counts.get(a, 0) + 1
            if a == "oom":
                size = _nonneg(e.get("size"))
                if size is not None:
                    pid = e.get("pool_id")
                    ooms.append(OomEvent(
                        device=dev, size_bytes=size, stream=_stream(e.get("stream")),
                        device_free_bytes=_nonneg(e.get("device_free")),
                        time_us=_time_us(e.get("time_us")),
                        entries_after=n - 1 - i,
                        pool_id=_pool_id(pid, name) if pid is not None else None,
                        trace_index=i))
                    if tail is None:
                        tail = []
                        tails[dev] = TraceTail(start=i, entries=tail)
            if tail is not None:
                pid = e.get("pool_id")
                pool = ((int(pid[0]), int(pid[1])) if isinstance(pid, (list, tuple)) and len(pid) == 2
                        and all(i64(x) is not None for x in pid) else None)
                tail.append((a, _nonneg(e.get("addr")), _nonneg(e.get("size")), _stream(e.get("stream")),
                             pool))
        if counts:
            actions[dev] = counts
    return actions, ooms, traced, tails


def _nonneg(v) -> int | None:
    """A byte count or address: an int in [0, 2**63), else None (absent)."""
    v = i64(v)
    return v if v is not None and v >= 0 else None


def _time_us(v) -> int | None:
    """A trace time (µs since the epoch): finite and in [0, 2**63), else None."""
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and 0 <= v < 2.0**63 else None
    return _nonneg(v)


def _stream(v) -> int:
    v = i64(v)
    return 0 if v is None else v


def _parse_host(host_segments, host_traces) -> HostMemory:
    """Read pinned-host data defensively: a malformed host section never fails the device analysis."""
    counts: dict[str, int] = {}
    n_trace = 0
    if isinstance(host_traces, list):
        # one list of entries, or one list per device like device_traces: accept both
        lists = host_traces if host_traces and all(isinstance(t, list) for t in host_traces) else [host_traces]
        for t in lists:
            for e in t:
                if isinstance(e, dict):
                    n_trace += 1
                    a = label(e.get("action", "?"))
                    counts[a] = counts.get(a, 0) + 1
    problem = None
    nseg = nblk = 0
    reserved = allocated = pending = inactive = largest = 0
    if host_segments is None:
        problem = "the snapshot has host_traces but no host_segments"
    elif not isinstance(host_segments, list):
        problem = f"host_segments is {type(host_segments).__name__}, expected a list"
    else:
        for h in host_segments:
            total = h.get("total_size") if isinstance(h, dict) else None
            blocks = h.get("blocks") if isinstance(h, dict) else None
            if _nonneg(total) is None or not isinstance(blocks, list):
                problem = ("host_segments entries are not in the device segment layout "
                           "(total_size and a blocks list); host byte counts not read")
                break
            nseg += 1
            reserved += total
            for b in blocks:
                size = b.get("size") if isinstance(b, dict) else None
                state = b.get("state") if isinstance(b, dict) else None
                st = _STATES.get(state) if isinstance(state, str) else None
                if _nonneg(size) is None or st is None:
                    problem = ("a host_segments block has no integer size or a state other than "
                               "active_allocated/active_pending_free/inactive; host byte counts not read")
                    break
                nblk += 1
                if st == ALLOCATED:
                    allocated += size
                elif st == PENDING_FREE:
                    pending += size
                else:
                    inactive += size
                    largest = max(largest, size)
            if problem:
                break
    if problem:
        return HostMemory(segments=nseg, blocks=nblk, reserved_bytes=None, allocated_bytes=None,
                          active_pending_free_bytes=None, inactive_bytes=None, largest_free_block_bytes=None,
                          trace_entries=n_trace, trace_actions=dict(sorted(counts.items())), problem=problem)
    return HostMemory(segments=nseg, blocks=nblk, reserved_bytes=reserved, allocated_bytes=allocated,
                      active_pending_free_bytes=pending, inactive_bytes=inactive,
                      largest_free_block_bytes=largest, trace_entries=n_trace,
                      trace_actions=dict(sorted(counts.items())))


__all__ = ["Snapshot", "SnapshotError", "OomEvent", "TraceTail", "HostMemory", "read_snapshot", "load_snapshot_bytes",
           "parse_snapshot", "allocator_settings_summary", "parse_alloc_conf", "MAX_SNAPSHOT_BYTES",
           "INACTIVE", "ALLOCATED", "PENDING_FREE", "STATE_NAMES", "DEFAULT_POOL"]

