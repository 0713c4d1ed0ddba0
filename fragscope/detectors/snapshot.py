"""Memory-snapshot analysis: allocator numbers per device / pool / stream, OOM cause, verdict.

:func:`analyse_snapshot` is pure: a normalised :class:`~fragscope.collectors.snapshot.Snapshot` in, a
JSON-ready dict and findings out. Each finding's ``playbook`` holds the context its playbook is computed
from (``{"context": ...}``); :func:`fragscope.playbooks.snapshot.diagnose_snapshot` attaches the
playbooks, and ``diagnose_snapshot_file`` reads a file first (the CLI's and the agent's entry point).
Contract: docs/snapshot.md. Its parts: allocator facts (:mod:`.snapshot_allocator`), state as columns
(:mod:`.snapshot_state`), the OOM replay (:mod:`.snapshot_replay`), the segment map (:mod:`.snapshot_map`).

Definitions (../shared/notes/formats-and-analyses.md, "Allocator metrics (from a snapshot)"):
inactive = free blocks inside segments (external free); external_fragmentation = 1 − largest free
block / total free; releasable = what ``torch.cuda.empty_cache()`` could hand back (default-pool
segments with no active block, and whole mapping pages of free blocks in expandable segments);
internal waste = size − requested over allocated blocks; slivers = free large-pool blocks < 2 MiB.
No upstream tool gives a fragmentation score or verdict (pytorch/pytorch#29554, open since 2019).
"""
from __future__ import annotations

import numpy as np

from .. import ids
from ..collectors.snapshot import DEFAULT_POOL, OomEvent, Snapshot, allocator_settings_summary, parse_snapshot
from ..model import Evidence, Finding, Inconclusive, Severity, rank_findings
from .snapshot_allocator import (  # noqa: F401 - re-exported: the allocator facts of this analysis
    GiB,
    K_SMALL_SIZE,
    MiB,
    alloc_segment_size,
    fmt_bytes,
    round_request,
)
from .snapshot_map import MAP_CHARS, segment_map_rows  # noqa: F401 - re-exported
from .snapshot_replay import Replay, replay_to_oom  # noqa: F401 - re-exported
from .snapshot_state import BlockColumns, SegState, SnapshotConfig, pool_json
from .snapshot_state import ratio as _ratio

# Diagnosis ids this module emits (contracts, docs/snapshot.md)
FRAGMENTATION = ids.ALLOCATOR_FRAGMENTATION
OOM_CROSS_STREAM = ids.OOM_CROSS_STREAM
OOM_PRIVATE_POOL = ids.OOM_PRIVATE_POOL
OOM_MEMORY_CAP = ids.OOM_MEMORY_CAP
OOM_OUTSIDE_PYTORCH = ids.OOM_OUTSIDE_PYTORCH
OOM_CAPACITY = ids.OOM_CAPACITY
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


def analyse_snapshot(snap: Snapshot, cfg: SnapshotConfig = SnapshotConfig(), device: int | None = None,
                     device_total_bytes: int | dict[int, int] | None = None
                     ) -> tuple[dict, list[Finding]]:
    """Numbers, OOM classification, verdict and playbook for each device of ``snap``.

    ``device``: only that device. ``device_total_bytes``: GPU memory size (one int for all devices,
    or per device); without it an OOM cannot be blamed on memory held outside PyTorch.
    Returns (the JSON document of docs/snapshot.md, findings ranked most severe first).
    """
    ar = BlockColumns(snap, cfg)
    settings = allocator_settings_summary(snap)
    dump = SegState.from_dump(snap, ar) if snap.ooms else None
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
        "job": snap.job if snap.job is not None else _JOB_NOT_READ,
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


# A Snapshot built without reading its frames (in code): the job is unknown, and said so.
_JOB_NOT_READ = {"kind": "unknown", "name": "an unknown program", "stacks_read": 0, "stacks_with_frames": 0,
                 "evidence": [], "note": "stack frames not read: what produced the snapshot is unknown"}

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


def _analyse_device(snap: Snapshot, ar: BlockColumns, dump: SegState | None, cfg: SnapshotConfig, d: int,
                    settings: dict, device_total: int | None):
    on_dev = snap.seg_device == d
    m = ar.metrics(on_dev)
    m["private_pool_ratio"] = _ratio(m["private_pool_bytes"], m["reserved_bytes"])
    doc: dict = {"device": d, **m}
    pools_doc = []
    for pi in np.unique(snap.seg_pool[on_dev]):
        pm = ar.metrics(on_dev & (snap.seg_pool == pi))
        pid = snap.pools[int(pi)]
        pools_doc.append({"pool_id": pool_json(pid), "private": pid != DEFAULT_POOL, **pm})
    streams_doc = []
    if on_dev.any():
        keys = np.unique(np.stack([snap.seg_stream[on_dev], snap.seg_pool[on_dev].astype(np.int64)], 1), axis=0)
        for stream, pi in keys:
            sm = ar.metrics(on_dev & (snap.seg_stream == stream) & (snap.seg_pool == pi))
            streams_doc.append({"stream": int(stream), "pool_id": pool_json(snap.pools[int(pi)]), **sm})
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


def _oom_doc(snap: Snapshot, dump: SegState, cfg: SnapshotConfig, e: OomEvent, settings: dict,
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


def _classify_oom(cfg: SnapshotConfig, e: OomEvent, st: SegState, device_total: int | None) -> dict:
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
        why = (f"{fmt_bytes(same['inactive_bytes'])} was free on stream {e.stream} but the largest "
               f"free block was {fmt_bytes(same['largest_free_block_bytes'])}")
    elif other["inactive_bytes"] >= S:
        cls = "cross-stream"
        why = (f"{fmt_bytes(other['inactive_bytes'])} was free in blocks cached for other streams, "
               f"which stream {e.stream} cannot use")
    elif pool_idx == 0 and dev_m["private_pool_bytes"] >= S:
        cls = "private-pool"
        why = (f"{fmt_bytes(dev_m['private_pool_bytes'])} is held by private pools (CUDA graphs / "
               f"MemPool) that ordinary allocations cannot use")
    elif D is not None and D >= seg_req:
        cls = "memory-cap"
        why = (f"the driver still had {fmt_bytes(D)} free, enough for the {fmt_bytes(seg_req)} segment: "
               f"the allocator refused under a per-process memory limit")
    elif outside is not None and outside - cfg.outside_pytorch_allowance_bytes >= S:
        cls = "outside-pytorch"
        why = (f"{fmt_bytes(outside)} of the {fmt_bytes(device_total)} GPU is held outside PyTorch's "
               f"cache (other processes, NCCL, CUDA context)")
    else:
        cls = "capacity"
        why = (f"allocated {fmt_bytes(dev_m['allocated_bytes'])} of {fmt_bytes(dev_m['reserved_bytes'])} "
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
                 note=f"of {fmt_bytes(dm['inactive_bytes'])} free in {dm['free_blocks']} blocks"),
    ]
    if dm["sliver_count"]:
        ev.append(Evidence("sliver_count", float(dm["sliver_count"]), unit="blocks",
                           note=f"free large-pool blocks under {fmt_bytes(cfg.sliver_bytes)} "
                                f"({fmt_bytes(dm['sliver_bytes'])} in all)"))
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
    summary = (f"GPU {d}: {fmt_bytes(state['stranded'])} ({state['ratio'] * 100:.1f} %) of "
               f"{fmt_bytes(dm['reserved_bytes'])} reserved (default pool) is free but stuck in "
               f"{dm['free_blocks']} blocks inside segments that hold live tensors; the largest free block "
               f"is {fmt_bytes(dm['largest_free_block_bytes'])} (external fragmentation {state['ext']:.2f}); "
               f"empty_cache() could return {fmt_bytes(dm['releasable_bytes'])}.")
    return Finding(
        id=FRAGMENTATION, severity=Severity.WARNING,
        confidence=_fragmentation_confidence(state, oom=False), summary=summary,
        evidence=_fragmentation_evidence(dm, state, cfg),
        missing=["torch_alloc_retries_total"],  # a retry rate over time would confirm the cost
        subject={"gpu": str(d)}, playbook=_playbook_context(FRAGMENTATION, settings, dm),
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
    summary = (f"GPU {d}: out of memory allocating {fmt_bytes(oom['size_bytes'])} on stream "
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
                   playbook=_playbook_context(fid, settings, dm_dump, oom))



def _playbook_context(diagnosis: str, settings: dict, dm: dict, oom: dict | None = None) -> dict:
    """What the snapshot playbook is computed from (fragscope.playbooks.snapshot.snapshot_playbook)."""
    return {"context": {"diagnosis": diagnosis, "settings": settings, "dm": dm, "oom": oom}}


def analyse_snapshot_obj(obj: object, source: str = "snapshot", **kw) -> tuple[dict, list[Finding]]:
    """Analyse an in-memory snapshot (what ``torch.cuda.memory._snapshot()`` returned); playbooks as context."""
    return analyse_snapshot(parse_snapshot(obj, source=source), **kw)


__all__ = ["analyse_snapshot", "analyse_snapshot_obj", "host_memory_doc", "SnapshotConfig", "DIAGNOSIS_IDS",
           "OOM_CLASSES", "FRAGMENTATION", "OOM_CROSS_STREAM", "OOM_PRIVATE_POOL", "OOM_MEMORY_CAP",
           "OOM_OUTSIDE_PYTORCH", "OOM_CAPACITY", "segment_map_rows", "MAP_CHARS", "replay_to_oom", "Replay",
           "alloc_segment_size", "round_request"]
