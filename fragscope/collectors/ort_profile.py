"""ONNX Runtime profiling JSON (``SessionOptions.enable_profiling``) -> node executions,
and ORT's verbose session log (``log_severity_level=0``) -> node placement per provider.

ORT writes a Chrome-trace JSON array: ``Session`` events (``model_loading_uri``,
``session_initialization``, ``model_run``, ``SequentialExecutor::Execute``) and one ``Node`` event per
executed node and run, named ``<node>_kernel_time`` (older versions add ``_fence_before`` /
``_fence_after`` events, skipped here), with ``args.op_name``, ``args.provider`` (the execution
provider that ran it: ``CPUExecutionProvider``, ``CUDAExecutionProvider``, ...), ``args.node_index``,
and ``ts`` / ``dur`` in microseconds. Copies ORT inserts between providers are nodes too, with op
``MemcpyFromHost`` / ``MemcpyToHost``. Read with the stdlib ``json`` (a profile of 1,000 runs of a
500-node model is ~250 MB of JSON; files above 1 GiB are refused).
"""
from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field

MAX_BYTES = 1024**3


class ProfileError(ValueError):
    """An ORT profile that cannot be read; the message is one line."""


@dataclass(frozen=True, slots=True)
class NodeRun:
    name: str  # node name (without _kernel_time)
    op: str
    provider: str
    index: int  # node_index: the node's place in the graph (-1 unknown)
    ts_us: float
    dur_us: float
    run: int  # which model_run it belongs to (-1: outside any)
    output_types: tuple[str, ...] = ()  # element types of the outputs (int64 = shape arithmetic)


@dataclass
class OrtProfile:
    nodes: list[NodeRun] = field(default_factory=list)
    runs: list[tuple[float, float]] = field(default_factory=list)  # (ts, dur) of each model_run, µs
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def providers(self) -> list[str]:
        return sorted({n.provider for n in self.nodes})


def _types(shapes) -> tuple[str, ...]:
    out = []
    if isinstance(shapes, list):
        for d in shapes:
            if isinstance(d, dict):
                out.extend(str(k) for k in d)
    return tuple(out)


_FALLBACK_RUNS = 64
_NONBLANK = re.compile(r"\S[^\n]*")  # a line from its first non-blank character: one C scan over blank runs


def _tid_key(tid):
    """A thread id as a dict key (a hostile profile may give a list or a dict)."""
    return tid if isinstance(tid, (int, str, float)) and not isinstance(tid, bool) else ("?", str(tid)[:64])


def parse_events(events, source: str = "profile") -> OrtProfile:
    if isinstance(events, dict):
        events = events.get("traceEvents")
    if not isinstance(events, list):
        raise ProfileError(f"{source}: not an ONNX Runtime profile (expected a JSON array of trace events)")
    prof = OrtProfile(source=source)
    bad = 0
    raw = []
    run_tids: list = []
    for e in events:
        if not isinstance(e, dict):
            bad += 1
            continue
        cat, name = e.get("cat"), e.get("name")
        try:
            ts, dur = float(e.get("ts", "nan")), float(e.get("dur", "nan"))
        except (TypeError, ValueError):
            bad += 1
            continue
        if not (ts == ts and dur == dur) or dur < 0:
            bad += 1
            continue
        tid = e.get("tid")
        if cat == "Session" and name == "model_run":
            prof.runs.append((ts, dur))
            run_tids.append((ts, dur, tid))
        elif cat == "Node" and isinstance(name, str) and name.endswith("_kernel_time"):
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            try:
                idx = int(args.get("node_index", -1))
            except (TypeError, ValueError):
                idx = -1
            raw.append((name[: -len("_kernel_time")], str(args.get("op_name", "?")),
                        str(args.get("provider", "?")), idx, ts, dur, _types(args.get("output_type_shape")), tid))
    if not raw:
        raise ProfileError(f"{source}: no node events (cat 'Node', '*_kernel_time'): not an ONNX Runtime "
                           "profile, or profiling ended before any run")
    if bad:
        prof.notes.append(f"{bad} malformed events skipped")
    # A node belongs to the model_run that contains it on the same thread (concurrent Run() calls from
    # several threads overlap in time; the sequential executor runs nodes on the calling thread): runs of
    # one thread do not overlap, so the candidate is the last run of the node's thread that started before
    # it, found by bisection (a walk back through all runs was quadratic: 16k runs took 32 s). A node on
    # a thread with no containing run takes the latest containing run of another thread, looked for among
    # the _FALLBACK_RUNS runs that started last before it.
    run_tids.sort(key=lambda r: r[0])
    prof.runs = [(r[0], r[1]) for r in run_tids]
    starts = [r[0] for r in run_tids]
    per_tid: dict = {}
    for i, (rts, _rdur, rtid) in enumerate(run_tids):
        lst = per_tid.setdefault(_tid_key(rtid), ([], []))
        lst[0].append(rts)
        lst[1].append(i)
    for name, op, prov, idx, ts, dur, types, tid in raw:
        run = -1
        mine = per_tid.get(_tid_key(tid))
        if mine is not None:
            j = bisect.bisect_right(mine[0], ts) - 1
            if j >= 0:
                k = mine[1][j]
                if ts <= run_tids[k][0] + run_tids[k][1]:
                    run = k
        if run < 0:
            i = bisect.bisect_right(starts, ts) - 1
            stop = max(-1, i - _FALLBACK_RUNS)
            while i > stop:
                rts, rdur, _ = run_tids[i]
                if ts <= rts + rdur:
                    run = i
                    break
                i -= 1
        prof.nodes.append(NodeRun(name, op, prov, idx, ts, dur, run, types))
    prof.nodes.sort(key=lambda n: (n.ts_us, n.index))
    return prof


def _read(path: str) -> bytes:
    """The file's bytes (gunzipped, at most MAX_BYTES once decompressed) through the one reader."""
    from .inputs import InputError, read_bytes

    try:
        return read_bytes(path, MAX_BYTES, "ONNX Runtime profile")
    except InputError as e:
        raise ProfileError(str(e)) from None


def read_profile(path: str, raw: bytes | None = None) -> OrtProfile:
    from ..units import load_json_checked

    raw = _read(path) if raw is None else raw
    try:
        data = load_json_checked(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ProfileError(f"{path}: not UTF-8 text ({str(e)[:80]})") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not JSON ({str(e).splitlines()[0][:120]})") from None
    except ValueError as e:  # NaN, 1e400, a 4,300-digit integer, nesting too deep
        raise ProfileError(f"{path}: not a readable profile ({str(e).splitlines()[0][:120]})") from None
    return parse_events(data, source=path)


# --- the verbose session log (log_severity_level=0): node placement ----------------------------
_PLACED = re.compile(r"(All nodes|Node\(s\)) placed on \[(\w+)\]\.\s*Number of nodes:\s*(\d+)")
_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s{3}(\S.*)$")
_NOT_FOUND = re.compile(r"kernel not found in registries for Op type: (\w+) node name: (.*?)\s*$")
_ADD_COPY = re.compile(r"Add (MemcpyToHost|MemcpyFromHost) (?:before|after) (.*?) for (\w+)")
_OP = re.compile(r"(\w+)(?: \(([^)]*)\))?")


@dataclass
class Placement:
    """What ORT's verbose log says about node placement (counts and node lists per provider)."""

    counts: dict[str, int] = field(default_factory=dict)  # provider -> nodes
    nodes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # provider -> [(op, name)]
    all_on: str | None = None  # "All nodes placed on [X]"
    not_found: list[tuple[str, str]] = field(default_factory=list)  # (op, node) without a kernel on an EP
    copies_added: list[tuple[str, str, str]] = field(default_factory=list)  # (MemcpyToHost|FromHost, tensor, EP)
    source: str = ""

    @property
    def providers(self) -> list[str]:
        return sorted(self.counts)


def parse_verbose_log(lines, source: str = "log") -> Placement:
    """ORT's placement report, from a session log at VERBOSE severity. Keeps the last report when
    several sessions were created (one per model load)."""
    pl = Placement(source=source)
    current: str | None = None
    for raw in lines:
        line = raw.rstrip("\n")
        m = _PLACED.search(line)
        if m:
            prov, n = m.group(2), int(m.group(3))
            if m.group(1) == "All nodes":
                pl = Placement(source=source, not_found=pl.not_found, copies_added=pl.copies_added)
                pl.all_on = prov
            elif prov in pl.counts:  # a second session's report starts again
                pl = Placement(source=source, not_found=pl.not_found, copies_added=pl.copies_added)
            pl.counts[prov] = n
            pl.nodes.setdefault(prov, [])
            current = prov
            continue
        if "Node placements" in line:
            current = None
            continue
        m = _NODE.search(line)
        if m and current is not None:
            for op, name in _OP.findall(m.group(1)):
                pl.nodes[current].append((op, name))
            continue
        m = _NOT_FOUND.search(line)
        if m:
            pl.not_found.append((m.group(1), m.group(2)))
            continue
        m = _ADD_COPY.search(line)
        if m:
            pl.copies_added.append((m.group(1), m.group(2), m.group(3)))
    if not pl.counts:
        raise ProfileError(f"{source}: no node placement lines ('Node(s) placed on [...]'): create the session "
                           "with log_severity_level=0 (VERBOSE) to log them")
    return pl


def read_input(path: str) -> "OrtProfile | Placement":
    """A profile (JSON) or a verbose session log (text), told apart by content."""
    raw = _read(path)
    if raw[:4096].decode("utf-8", errors="replace").lstrip()[:1] in ("[", "{"):
        return read_profile(path, raw)
    text = raw.decode("utf-8", errors="replace")
    del raw
    # lines that hold something, found in C: a run of blank lines (a gzip of newlines) costs no loop turn
    return parse_verbose_log((m.group() for m in _NONBLANK.finditer(text)), source=path)
