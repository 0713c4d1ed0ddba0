"""What program a memory snapshot came from, told by its stack frames. docs/snapshot.md#job.

``torch.cuda.memory._record_memory_history`` records a stack per block (``frames``: ``filename``, ``line``,
``name``; PyTorch ~2.0 keeps them in each block's ``history``) and per trace entry, Python frames by default and C++
ones with ``stacks="all"``. Module paths say whose code allocated: ``.../vllm/worker/...``, ``.../sglang/srt/...``,
``text_generation_server/...``, ``tensorrt_llm/...``, a backward pass or an optimizer step. The kinds and their
markers are the log reader's (collectors/enginelog/jobkind.py: ``FRAME_MARKERS``, the same kind names as ``KNOBS``),
and so is the order a kind wins in (a serving engine, then a training loop, then a desktop application).

A snapshot recorded with ``record_context=False`` (or ``context=None``), and ``torch.cuda.memory_snapshot()``'s bare
segments mostly, carry no frames: the job is then unknown, and so it is when no frame is any kind's code.

Cost: the OOM entries' stacks are read whole, the others sampled: about :data:`STACKS` stacks spread evenly over
the segments, their blocks and each device's trace ring, so a 100,000-block snapshot costs the same as a small one.
A frame is judged once (by identity: the unpickled snapshot shares one dict per distinct frame).
"""
from __future__ import annotations

from .enginelog.jobkind import KNOBS, frame_kind, job_kind

STACKS = 2048  # stacks sampled besides the OOMs' (about 1/4 from segments and blocks each, 1/2 from the traces)


def _every(seq: list, k: int) -> list:
    """About ``k`` items of ``seq``, evenly spread (at least one: more rings than stacks to sample)."""
    k = max(1, k)
    return seq if len(seq) <= k else seq[:: len(seq) // k]


def _stacks(obj, oom_entries) -> tuple[list, list]:
    """(sampled stacks, the OOM entries' stacks): each a list of frames, or whatever the file holds there."""
    if isinstance(obj, dict):
        segments, traces = obj.get("segments"), obj.get("device_traces")
    else:
        segments, traces = obj, None
    segments = segments if isinstance(segments, list) else []
    traces = traces if isinstance(traces, list) else []
    sampled: list = []
    picked = _every(segments, STACKS // 4)
    per_segment = max(1, STACKS // 4 // max(1, len(picked)))
    for s in picked:
        if not isinstance(s, dict):
            continue
        sampled.append(s.get("frames"))
        blocks = s.get("blocks")
        for b in _every(blocks, per_segment) if isinstance(blocks, list) else ():
            if not isinstance(b, dict):
                continue
            sampled.append(b.get("frames"))
            history = b.get("history")  # PyTorch ~2.0: the stack is in each history entry
            if isinstance(history, list):
                sampled += [h.get("frames") for h in history if isinstance(h, dict)]
    rings = [t for t in traces if isinstance(t, list)]
    for t in rings:
        sampled += [e.get("frames") for e in _every(t, STACKS // 2 // max(1, len(rings))) if isinstance(e, dict)]
    oom = []
    for dev, i in oom_entries:
        t = traces[dev] if 0 <= dev < len(traces) else None
        if isinstance(t, list) and i is not None and 0 <= i < len(t) and isinstance(t[i], dict):
            oom.append(t[i].get("frames"))
    return sampled, oom


def _judge(fr) -> tuple[str, str] | None:
    """(kind, "path:line (name)") of one frame, or None: not a dict with a filename, or no kind's code."""
    if not (isinstance(fr, dict) and isinstance(fr.get("filename"), str)):
        return None
    name = fr.get("name") if isinstance(fr.get("name"), str) else ""
    hit = frame_kind(fr["filename"], name)
    if hit is None:
        return None
    line = fr.get("line")
    # (a line number as written by the profiler: a huge int would not even convert to text)
    ok = isinstance(line, int) and not isinstance(line, bool) and 0 <= line < 1 << 31
    where = f"{hit[1]}:{line}" if ok else hit[1]
    return hit[0], f"{where} ({name})" if name else where


def snapshot_job(obj, oom_entries=()) -> dict:
    """The ``job`` of docs/snapshot.md: ``kind`` (a ``KNOBS`` kind), ``name``, ``stacks_read`` (stacks looked at),
    ``stacks_with_frames``, ``evidence`` (per kind seen: an example frame and in how many of the stacks read, the
    failing allocation's among them or not), ``note`` (why the job is unknown, else None).

    ``oom_entries``: (device index in ``device_traces``, trace position) of each OOM entry.
    """
    sampled, oom = _stacks(obj, list(oom_entries))
    seen: dict[int, tuple[str, str] | None] = {}  # id(frame) -> (kind, "path:line (name)") or None
    counts: dict[str, int] = {}
    example: dict[str, str] = {}
    in_oom: set[str] = set()
    with_frames = 0
    for n, stack in enumerate(oom + sampled):
        if not isinstance(stack, list) or not stack:
            continue
        with_frames += 1
        kinds = set()
        for fr in stack:
            j = seen.get(id(fr), False)
            if j is False:
                j = seen[id(fr)] = _judge(fr)
            if j is not None:
                kinds.add(j[0])
                example.setdefault(j[0], j[1])
        for k in kinds:
            counts[k] = counts.get(k, 0) + 1
            if n < len(oom):
                in_oom.add(k)
    stacks = len(oom) + len(sampled)
    kind = job_kind(set(counts))
    evidence = [f"{KNOBS[k]['name']}: {example[k]} in {counts[k]} of the {with_frames} recorded stacks read"
                + (", the failing allocation's among them" if k in in_oom else "")
                for k in sorted(counts, key=lambda k: -counts[k])]
    note = None
    if not with_frames:
        note = ("the snapshot records no stack frames (recorded with record_context=False or context=None, or a "
                "bare memory_snapshot()): what produced it is unknown")
    elif kind == "unknown":
        note = (f"none of the {with_frames} stacks read goes through a serving engine's, a training loop's or a "
                "desktop application's code: what produced it is unknown")
    return {"kind": kind, "name": KNOBS[kind]["name"], "stacks_read": stacks, "stacks_with_frames": with_frames,
            "evidence": evidence, "note": note}


__all__ = ["snapshot_job", "STACKS"]
