"""Engine log files: vLLM V0 / V1, SGLang, and PyTorch OOM messages. Signals: docs/logs.md.

Two halves, kept apart (STYLE.md): pure parsing (:func:`parse_log_line`, :func:`parse_log`,
:class:`LogParser`) turns text lines into :class:`LogEvent` records with timestamps; the
:class:`LogCollector` follows a file the way ``tail -F`` does (rotation, truncation, partial last
lines held back, a bounded read per tick) and turns the events it reads into samples.
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Iterable, Iterator, Mapping

from ..model import CollectResult, Missing, Reason, Sample, make_labels

log = logging.getLogger(__name__)

GIB = 1024.0 ** 3
MIB = 1024.0 ** 2
KIB = 1024.0
# PyTorch's c10 format_size prints "bytes", "KiB", "MiB", "GiB". vLLM V0 prints "GB" but divides by
# 2**30 (model_runner: "Loading model weights took %.4f GB", bytes / float(2**30)): binary too.
_UNITS = {"b": 1.0, "byte": 1.0, "bytes": 1.0, "kib": KIB, "kb": KIB, "mib": MIB, "mb": MIB,
          "gib": GIB, "gb": GIB, "tib": GIB * 1024, "tb": GIB * 1024}
_SIZE = r"(\d[\d,]*(?:\.\d+)?)\s*(bytes|byte|B|KiB|KB|MiB|MB|GiB|GB|TiB|TB)\b"

# Event kinds (LogEvent.kind), a contract: docs/logs.md#events
KINDS = ("preemption", "retraction", "stats", "kv_cache_tokens", "kv_blocks", "max_concurrency",
         "memory_profile", "kv_memory", "weights", "cuda_graph", "config", "oom",
         "startup_memory_shortfall", "kv_insufficient")


@dataclass(slots=True)
class LogEvent:
    """One parsed log line. ``ts`` is unix seconds (None until a timestamped line was seen)."""

    kind: str
    ts: float | None
    line_no: int  # 1-based line number in the input
    fields: dict = field(default_factory=dict)  # numbers in base units (bytes, ratios, tokens/s)
    engine: str = ""  # vLLM V1 engine index ("0"), "all" for "N Engines Aggregated"
    source: str = ""  # vllm-v0 | vllm-v1 | sglang | torch
    text: str = ""  # the message with prefixes stripped (first 400 characters)
    pid: int | None = None  # "(EngineCore pid=199)" prefix

    def to_dict(self) -> dict:
        return {"kind": self.kind, "time": self.ts, "line": self.line_no, "engine": self.engine,
                "source": self.source, "pid": self.pid, "fields": dict(self.fields), "text": self.text}


# ---------------------------------------------------------------------------------------------
# Line cleaning
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# `kubectl logs --timestamps`: "2026-02-24T20:21:58.123456789Z " ; CI / SGLang: "[2026-02-24T20:21:58Z] ",
# "[2026-09-13 16:06:06] ", "[2026-09-13 16:06:06 TP0] "
_ISO_BRACKET = re.compile(r"^\[(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)([.,]\d+)?(Z|[+-]\d\d:?\d\d)?(?: [^\]]*)?\]\s*")
_ISO_BARE = re.compile(r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)([.,]\d+)?(Z|[+-]\d\d:?\d\d)?\s+")
# docker compose: "vllm-1  | "
_COMPOSE_PREFIX = re.compile(r"^[\w.\-]+\s+\|\s")
# "(APIServer pid=1) ", "(EngineCore_DP0 pid=199) ", "(RayWorkerWrapper pid=7106, ip=10.0.0.1) "
_PROC_PREFIX = re.compile(r"^\(([A-Za-z][\w\-]*) pid=(\d+)(?:,[^)]*)?\)\s*")
# vLLM header: "INFO 05-21 21:08:08 [gpu_model_runner.py:4879] " (V0 often "file.py:528] " without "[")
_VLLM_HEADER = re.compile(r"^(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)?"
                          r"\s+\[?[\w./\-]+:\d+\]\s?")
# Python logging default: "2024-05-01 12:00:00,123 - name - INFO - " is handled by _ISO_BARE; then:
_LEVEL_PREFIX = re.compile(r"^(?:-\s*)?(?:[\w.]+\s+-\s+)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)(?::|\s+-)?\s+")


@dataclass(slots=True)
class _Clean:
    msg: str
    ts: float | None
    pid: int | None
    proc: str


def _year_for(month: int, day: int, hms: tuple[int, int, int], ref: datetime, tz: tzinfo) -> float | None:
    """MM-DD HH:MM:SS has no year: take the latest year that does not put the line after ``ref``
    (plus two days of slack for time zones). A December line read in January lands in last year."""
    limit = ref + timedelta(days=2)
    for year in range(ref.year + 1, ref.year - 5, -1):
        try:
            d = datetime(year, month, day, *hms, tzinfo=tz)
        except ValueError:  # 02-29 in a non-leap year, or garbage
            continue
        if d <= limit:
            return d.timestamp()
    return None


def _clean(line: str, ref: datetime, tz: tzinfo) -> _Clean:
    s = line.rstrip("\r\n")
    if "\x1b" in s:
        s = _ANSI.sub("", s)
    s = s.strip()
    ts: float | None = None
    pid: int | None = None
    proc = ""
    m = _COMPOSE_PREFIX.match(s)
    if m and not s.startswith(("INFO", "WARNING", "ERROR", "DEBUG")):
        s = s[m.end():]
    for _ in range(3):  # prefixes stack: "[iso] (EngineCore pid=1) INFO 05-21 ..."
        m = _ISO_BRACKET.match(s) or _ISO_BARE.match(s)
        if m:
            ts = _iso_ts(m, tz)
            s = s[m.end():]
            continue
        m = _PROC_PREFIX.match(s)
        if m:
            proc, pid = m.group(1), int(m.group(2))
            s = s[m.end():]
            continue
        break
    m = _VLLM_HEADER.match(s)
    if m:
        mo, dd, hh, mi, ss = (int(m.group(i)) for i in range(2, 7))
        t = _year_for(mo, dd, (hh, mi, ss), ref, tz)
        if ts is None:  # an ISO prefix (with a year) is more precise than MM-DD
            ts = t
        s = s[m.end():]
    else:
        m = _LEVEL_PREFIX.match(s)
        if m and ts is not None:
            s = s[m.end():]
    return _Clean(s, ts, pid, proc)


def _iso_ts(m: re.Match, tz: tzinfo) -> float | None:
    try:
        d = datetime.strptime(f"{m.group(1)} {m.group(2)}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    frac = float("0." + m.group(3)[1:7]) if m.group(3) else 0.0
    z = m.group(4)
    if z is None:
        d = d.replace(tzinfo=tz)
    elif z == "Z":
        d = d.replace(tzinfo=timezone.utc)
    else:
        sign = 1 if z[0] == "+" else -1
        hh, mm = int(z[1:3]), int(z[-2:])
        d = d.replace(tzinfo=timezone(sign * timedelta(hours=hh, minutes=mm)))
    return d.timestamp() + frac


# ---------------------------------------------------------------------------------------------
# Numbers
def parse_size(num: str, unit: str) -> float:
    """'24.2840', 'GB' -> bytes (binary units throughout, see _UNITS)."""
    return float(round(float(num.replace(",", "")) * _UNITS[unit.lower()]))


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def _find_size(pattern: re.Pattern, text: str) -> float | None:
    m = pattern.search(text)
    return parse_size(m.group(1), m.group(2)) if m else None


# ---------------------------------------------------------------------------------------------
# Message patterns (vLLM file:function in comments; formats in /work/shared/notes/metrics-and-logs.md)
# V0 core/scheduler.py::_preempt, WARNING on the 1st and every 50th preemption
_PREEMPT = re.compile(r"(?:Sequence group|Request) (\S+) is preempted by PreemptionMode\.(\w+)"
                      r".*?(?:total_num_cumulative_preemption|total_cumulative_preemption_cnt)=(\d+)")
# SGLang scheduler: "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 646, ..."
_RETRACT = re.compile(r"Retract requests\. #retracted_reqs: (\d+)")
_RETRACT_GAINED = re.compile(r"#new_tokens_gained: (\d+)")
_RETRACT_RATIO = re.compile(r"#new_token_ratio: ([\d.]+) -> ([\d.]+)")
# stats lines (V0 metrics.py, V1 loggers.py): fields matched one by one so added/reordered fields survive
_ENGINE = re.compile(r"^(?:Engine (\d+)|(\d+) Engines Aggregated):")
_F_PROMPT_TPS = re.compile(r"Avg prompt throughput: ([\d.]+) tokens/s")
_F_GEN_TPS = re.compile(r"Avg generation throughput: ([\d.]+) tokens/s")
_F_RUNNING = re.compile(r"Running: (\d+) reqs")
_F_WAITING = re.compile(r"(?:Waiting|Pending): (\d+) reqs")
_F_SWAPPED = re.compile(r"Swapped: (\d+) reqs")
_F_PREEMPTIONS = re.compile(r"Preemptions: (\d+)")
_F_KV_USAGE = re.compile(r"\b(GPU|CPU|XPU|TPU|HPU|NPU) KV cache usage: ([\d.]+)%")
_F_PREFIX_HIT = re.compile(r"(?<!External )(?<!MM )Prefix cache hit rate: ([\d.]+)%")
# SGLang "Decode batch, #running-req: 66, #token: 84642, token usage: 0.97, cuda graph: False,
# gen throughput (token/s): 2574.67, #queue-req: 11" (older: "Decode batch. ..."), and "Prefill batch. ..."
_SG_BATCH = re.compile(r"^(Decode|Prefill) batch[.,]")
_SG_RUNNING = re.compile(r"#running-req: (\d+)")
_SG_TOKENS = re.compile(r"#token: (\d+)")
_SG_USAGE = re.compile(r"(?<!swa )token usage: ([\d.]+)")
_SG_GEN_TPS = re.compile(r"gen throughput \(token/s\): ([\d.]+)")
_SG_QUEUE = re.compile(r"#queue-req: (\d+)")
# startup capacity
_KV_TOKENS = re.compile(r"\b(GPU|CPU|XPU|TPU|HPU|NPU) KV cache size: ([\d,]+) tokens")
_MAX_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.,]+)x")
_BLOCKS = re.compile(r"# (GPU|NPU|XPU|TPU|HPU) blocks: (\d+), # CPU blocks: (\d+)")
_AVAIL_KV = re.compile(r"Available KV cache memory: " + _SIZE)
_WEIGHTS = re.compile(r"(?:Loading model weights took|Model loading took) " + _SIZE)
_GRAPH = re.compile(r"Graph capturing finished in ([\d.]+) secs?(?:, took " + _SIZE + r")?")
_PROFILE_KV = {  # V0 worker.py "Memory profiling results: total_gpu_memory=63.43GiB ... gpu_memory_utilization=0.90"
    "total_gpu_memory_bytes": re.compile(r"total_gpu_memory=" + _SIZE),
    "initial_memory_usage_bytes": re.compile(r"initial_memory_usage=" + _SIZE),
    "peak_torch_memory_bytes": re.compile(r"peak_torch_memory=" + _SIZE),
    "non_torch_memory_bytes": re.compile(r"non_torch_memory=" + _SIZE),
    "kv_cache_bytes": re.compile(r"kv_cache_size=" + _SIZE),
}
# later V0 (0.6.4+) wording of the same profile, one or several lines
_PROFILE_PROSE = {
    "total_gpu_memory_bytes": re.compile(r"total_gpu_memory \(" + _SIZE + r"\)"),
    "weights_bytes": re.compile(r"model weights take " + _SIZE),
    "non_torch_memory_bytes": re.compile(r"non_torch_memory takes " + _SIZE),
    "activation_peak_bytes": re.compile(r"PyTorch activation peak memory takes " + _SIZE),
    "kv_cache_bytes": re.compile(r"(?:the rest of the memory reserved for KV Cache is|reserved for KV Cache is) " + _SIZE),
}
_GMU = re.compile(r"gpu_memory_utilization(?:=| \()([\d.]+)")
_CFG_BLOCK = re.compile(r"\bblock_size=(\d+)")
_CFG_MAXLEN = re.compile(r"\b(?:max_model_len|max_seq_len)=(\d+)")
_CFG_TP = re.compile(r"\btensor_parallel_size=(\d+)")
_CFG_KVDTYPE = re.compile(r"\bkv_cache_dtype=['\"]?([\w.]+)")
# V1 gpu_worker.py init_device ValueError
_SHORTFALL = re.compile(r"Free memory on device(?: \S+)? \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired "
                        r"GPU memory utilization \(([\d.]+), ([\d.]+) GiB\)")
_KV_INSUFF = re.compile(r"max seq len \((\d+)\), \(?([\d.]+) GiB\)? KV cache is needed, which is larger than the "
                        r"available KV cache memory \(([\d.]+) GiB\)")
_KV_INSUFF_EST = re.compile(r"estimated maximum model length is (\d+)")
# PyTorch OOM, three generations (notes section 5). Fields matched one by one inside the message.
_OOM = re.compile(r"\b(CUDA|HIP|NPU|XPU|MPS) out of memory\. Tried to allocate " + _SIZE)
_OOM_OLD_DEV = re.compile(r"\((GPU|NPU|XPU) (\d+); ")
_OOM_OLD_TOTAL = re.compile(_SIZE + r" total capacity")
_OOM_OLD_ALLOC = re.compile(_SIZE + r" already allocated")
_OOM_OLD_FREE = re.compile(_SIZE + r" free")
_OOM_OLD_RESERVED = re.compile(_SIZE + r" (?:reserved in total by PyTorch|cached)")
_OOM_NEW_HEAD = re.compile(r"(GPU|NPU|XPU) (\d+) has a total capac(i?)ty of " + _SIZE + r" of which " + _SIZE + r" is free")
_OOM_NEW_PROC = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_OOM_NEW_THIS = re.compile(r"this process has " + _SIZE + r" memory in use")
_OOM_NEW_ALLOC = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_OOM_NEW_UNALLOC = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")
_OOM_NEW_PRIVATE = re.compile(r"(?:and )?" + _SIZE + r" is allocated by PyTorch in private pools")
_OOM_RUNTIME = re.compile(r"\b(CUDA|HIP) error: out of memory")

# cheap substring gates before any regex (most lines are request logs)
_GATES = ("preempted by", "Retract requests", "throughput", "batch", "KV cache", "blocks:", "Maximum concurrency",
          "profiling", "weights", "loading took", "Graph capturing", "gpu_memory_utilization", "block_size=",
          "out of memory", "Free memory on device", "KV Cache is", "model weights take", "non_torch_memory")


def _parse_message(msg: str) -> list[tuple[str, dict, str, str]]:
    """Events in one cleaned message: (kind, fields, engine, source)."""
    if not any(g in msg for g in _GATES):
        return []
    out: list[tuple[str, dict, str, str]] = []
    m = _PREEMPT.search(msg)
    if m:
        out.append(("preemption", {"request_id": m.group(1), "mode": m.group(2).lower(),
                                   "cumulative": int(m.group(3))}, "", "vllm-v0"))
        return out
    m = _RETRACT.search(msg)
    if m:
        f: dict = {"retracted": int(m.group(1))}
        g = _RETRACT_GAINED.search(msg)
        if g:
            f["new_tokens_gained"] = int(g.group(1))
        r = _RETRACT_RATIO.search(msg)
        if r:
            f["new_token_ratio_before"], f["new_token_ratio_after"] = float(r.group(1)), float(r.group(2))
        out.append(("retraction", f, "", "sglang"))
        return out
    if "Avg prompt throughput:" in msg or "Avg generation throughput:" in msg:
        out.append(_stats(msg))
        return out
    m = _SG_BATCH.match(msg)
    if m:
        f = {"phase": m.group(1).lower()}
        for key, rx, conv in (("running", _SG_RUNNING, int), ("tokens", _SG_TOKENS, int),
                              ("kv_usage_ratio", _SG_USAGE, float), ("generation_tps", _SG_GEN_TPS, float),
                              ("waiting", _SG_QUEUE, int)):
            g = rx.search(msg)
            if g:
                f[key] = conv(g.group(1))
        if len(f) > 1:
            out.append(("stats", f, "", "sglang"))
        return out
    m = _OOM.search(msg)
    if m:
        out.append(("oom", _oom_fields(msg, m), "", "torch"))
        return out
    m = _OOM_RUNTIME.search(msg)
    if m:
        out.append(("oom", {"wording": "cuda-error", "device_type": m.group(1)}, "", "torch"))
        return out
    m = _KV_TOKENS.search(msg)
    if m:
        out.append(("kv_cache_tokens", {"tokens": _int(m.group(2)), "device": m.group(1).lower()}, "", "vllm-v1"))
    m = _MAX_CONC.search(msg)
    if m:
        out.append(("max_concurrency", {"tokens_per_request": _int(m.group(1)),
                                        "concurrency": float(m.group(2).replace(",", ""))}, "", "vllm"))
    if out:
        return out
    m = _BLOCKS.search(msg)
    if m:
        out.append(("kv_blocks", {"gpu_blocks": int(m.group(2)), "cpu_blocks": int(m.group(3))}, "", "vllm-v0"))
        return out
    m = _AVAIL_KV.search(msg)
    if m:
        out.append(("kv_memory", {"kv_cache_bytes": parse_size(m.group(1), m.group(2))}, "", "vllm-v1"))
        return out
    m = _WEIGHTS.search(msg)
    if m:
        out.append(("weights", {"weights_bytes": parse_size(m.group(1), m.group(2))}, "", "vllm"))
        return out
    m = _GRAPH.search(msg)
    if m:
        f = {"seconds": float(m.group(1))}
        if m.group(2):
            f["cuda_graph_bytes"] = parse_size(m.group(2), m.group(3))
        out.append(("cuda_graph", f, "", "vllm"))
        return out
    m = _SHORTFALL.search(msg)
    if m:
        out.append(("startup_memory_shortfall", {
            "free_bytes": float(m.group(1)) * GIB, "total_bytes": float(m.group(2)) * GIB,
            "gpu_memory_utilization": float(m.group(3)), "requested_bytes": float(m.group(4)) * GIB}, "", "vllm-v1"))
        return out
    m = _KV_INSUFF.search(msg)
    if m:
        f = {"max_model_len": int(m.group(1)), "needed_bytes": float(m.group(2)) * GIB,
             "available_bytes": float(m.group(3)) * GIB}
        e = _KV_INSUFF_EST.search(msg)
        if e:
            f["estimated_max_model_len"] = int(e.group(1))
        out.append(("kv_insufficient", f, "", "vllm"))
        return out
    if "Memory profiling results" in msg or "model weights take" in msg or "reserved for KV Cache" in msg \
            or "non_torch_memory takes" in msg:
        f = {}
        for key, rx in [*_PROFILE_KV.items(), *_PROFILE_PROSE.items()]:
            if key not in f:
                v = _find_size(rx, msg)
                if v is not None:
                    f[key] = v
        g = _GMU.search(msg)
        if g:
            f["gpu_memory_utilization"] = float(g.group(1))
        if f:
            out.append(("memory_profile", f, "", "vllm-v0"))
        return out
    if ("block_size=" in msg or "gpu_memory_utilization=" in msg) and ("Namespace(" in msg or "config" in msg):
        f = {}
        for key, rx, conv in (("block_size", _CFG_BLOCK, int), ("gpu_memory_utilization", _GMU, float),
                              ("max_model_len", _CFG_MAXLEN, int), ("tensor_parallel_size", _CFG_TP, int),
                              ("kv_cache_dtype", _CFG_KVDTYPE, str)):
            g = rx.search(msg)
            if g:
                f[key] = conv(g.group(1))
        if f:
            out.append(("config", f, "", "vllm"))
    return out


def _stats(msg: str) -> tuple[str, dict, str, str]:
    f: dict = {}
    engine = ""
    e = _ENGINE.match(msg)
    if e:
        engine = e.group(1).lstrip("0") or "0" if e.group(1) is not None else "all"
        if e.group(2) is not None:
            f["engines"] = int(e.group(2))
    for key, rx, conv in (("prompt_tps", _F_PROMPT_TPS, float), ("generation_tps", _F_GEN_TPS, float),
                          ("running", _F_RUNNING, int), ("waiting", _F_WAITING, int),
                          ("swapped", _F_SWAPPED, int), ("preemptions", _F_PREEMPTIONS, int)):
        g = rx.search(msg)
        if g:
            f[key] = conv(g.group(1))
    usages = _F_KV_USAGE.findall(msg)
    if usages:  # V0 prints GPU then CPU (swap space); V1 prints the pool's device only
        dev, pct = next(((d, p) for d, p in usages if d == "GPU"), usages[0])
        f["kv_usage_ratio"] = round(float(pct) / 100.0, 6)
        f["device"] = dev.lower()
    g = _F_PREFIX_HIT.search(msg)
    if g:
        f["prefix_cache_hit_ratio"] = round(float(g.group(1)) / 100.0, 6)
    source = "vllm-v1" if (e or "Waiting:" in msg) else "vllm-v0"
    return ("stats", f, engine, source)


def _oom_fields(msg: str, head: re.Match) -> dict:
    f: dict = {"device_type": head.group(1), "requested_bytes": parse_size(head.group(2), head.group(3))}
    new = _OOM_NEW_HEAD.search(msg)
    if new:
        f["wording"] = "2.1" if new.group(3) == "" else ">=2.2"  # 2.1 printed "total capacty"
        f["gpu"] = new.group(2)
        f["total_bytes"] = parse_size(new.group(4), new.group(5))
        f["free_bytes"] = parse_size(new.group(6), new.group(7))
        v = _find_size(_OOM_NEW_THIS, msg)
        if v is not None:
            f["process_in_use_bytes"] = v
        others = [{"pid": int(p), "bytes": parse_size(n, u)} for p, n, u in _OOM_NEW_PROC.findall(msg)]
        if others:
            f["other_processes"] = others
        v = _find_size(_OOM_NEW_ALLOC, msg)
        if v is not None:
            f["allocated_bytes"] = v
        v = _find_size(_OOM_NEW_UNALLOC, msg)
        if v is not None:
            f["reserved_unallocated_bytes"] = v
        v = _find_size(_OOM_NEW_PRIVATE, msg)
        if v is not None:
            f["private_pool_bytes"] = v
        if "allocated_bytes" in f and "reserved_unallocated_bytes" in f:
            f["reserved_bytes"] = f["allocated_bytes"] + f["reserved_unallocated_bytes"]
        return f
    f["wording"] = "<=2.0"
    d = _OOM_OLD_DEV.search(msg)
    if d:
        f["gpu"] = d.group(2)
    # restrict to the parenthesised detail so "Tried to allocate" is not read as a figure
    detail = msg[d.end():] if d else msg[head.end():]
    for key, rx in (("total_bytes", _OOM_OLD_TOTAL), ("allocated_bytes", _OOM_OLD_ALLOC),
                    ("free_bytes", _OOM_OLD_FREE), ("reserved_bytes", _OOM_OLD_RESERVED)):
        v = _find_size(rx, detail)
        if v is not None:
            f[key] = v
    if "reserved_bytes" in f and "allocated_bytes" in f:
        # <=2.0 prints reserved and allocated; their difference is the same figure 2.1+ prints directly
        f["reserved_unallocated_bytes"] = max(0.0, f["reserved_bytes"] - f["allocated_bytes"])
        f["reserved_unallocated_derived"] = True
    return f


# ---------------------------------------------------------------------------------------------
class LogParser:
    """Stateful line parser: carries the last timestamp to lines without one, infers the year of
    ``MM-DD`` timestamps from ``reference`` (unix seconds; default now), and folds repeats of the
    same OOM message (the worker, the engine core and the traceback each print it) into one event.
    """

    OOM_REPEAT_SECONDS = 30.0  # same figures within this window: the same OOM printed again

    def __init__(self, reference: float | None = None, tz: tzinfo | None = None) -> None:
        self.tz = tz or timezone.utc
        self.set_reference(reference)
        self.line_no = 0
        self.last_ts: float | None = None
        self._last_oom: tuple | None = None
        self._last_oom_ts: float | None = None
        self._last_oom_event: LogEvent | None = None
        self._last_shortfall: tuple | None = None

    def set_reference(self, reference: float | None) -> None:
        self.ref = datetime.fromtimestamp(time.time() if reference is None else reference, tz=self.tz)

    def feed(self, line: str) -> list[LogEvent]:
        self.line_no += 1
        c = _clean(line, self.ref, self.tz)
        if c.ts is not None:
            self.last_ts = c.ts
        ts = self.last_ts
        found = _parse_message(c.msg)
        if not found:
            return []
        events = []
        for kind, fields, engine, source in found:
            if kind == "oom" and self._is_repeat_oom(fields, ts):
                continue
            if kind == "startup_memory_shortfall":
                sig = tuple(sorted(fields.items()))
                if sig == self._last_shortfall:
                    continue
                self._last_shortfall = sig
            ev = LogEvent(kind, ts, self.line_no, fields, engine, source, c.msg[:400], c.pid)
            if kind == "oom":
                self._last_oom_event = ev
            events.append(ev)
        return events

    def _is_repeat_oom(self, fields: dict, ts: float | None) -> bool:
        sig = tuple(sorted((k, v) for k, v in fields.items() if not isinstance(v, list)))
        repeat = (sig == self._last_oom and self._last_oom_event is not None
                  and (ts is None or self._last_oom_ts is None or abs(ts - self._last_oom_ts) <= self.OOM_REPEAT_SECONDS))
        if repeat:
            self._last_oom_event.fields["repeats"] = self._last_oom_event.fields.get("repeats", 1) + 1
            return True
        self._last_oom, self._last_oom_ts = sig, ts
        return False


def parse_log_line(line: str, reference: float | None = None, tz: tzinfo | None = None) -> LogEvent | None:
    """The first event on one line (None if the line holds nothing fragscope reads).

    A line without a timestamp gets ``ts=None``; :func:`parse_log` carries the previous one.
    """
    ev = LogParser(reference, tz).feed(line)
    return ev[0] if ev else None


def parse_log(lines: Iterable[str], reference: float | None = None, tz: tzinfo | None = None) -> list[LogEvent]:
    """Every event in ``lines`` (an open file works), in order, timestamps carried forward."""
    p = LogParser(reference, tz)
    out: list[LogEvent] = []
    for line in lines:
        out.extend(p.feed(line))
    return out


# ---------------------------------------------------------------------------------------------
# Samples (names are contracts: docs/logs.md#signals)
M_PREEMPTIONS = "fragscope_log_preemptions_total"
M_KV_CAPACITY = "fragscope_log_kv_cache_capacity_tokens"
M_KV_BLOCKS = "fragscope_log_kv_cache_capacity_blocks"
M_OOMS = "fragscope_log_ooms_total"
M_OOM_UNALLOC = "fragscope_log_oom_reserved_unallocated_bytes"
M_RUNNING = "fragscope_log_requests_running"
M_WAITING = "fragscope_log_requests_waiting"
M_KV_USAGE = "fragscope_log_kv_cache_usage_ratio"
M_GEN_TPS = "fragscope_log_generation_tokens_per_second"
SIGNAL_NAMES = (M_PREEMPTIONS, M_KV_CAPACITY, M_KV_BLOCKS, M_OOMS, M_OOM_UNALLOC, M_RUNNING, M_WAITING,
                M_KV_USAGE, M_GEN_TPS)


class LogState:
    """Folds events into counters and last values (shared by the collector and ``diagnose logs``)."""

    def __init__(self) -> None:
        self.preemptions_total: float | None = None  # None: this log format has not shown it reports them
        self._v0_offset = 0.0
        self._v0_last: float | None = None
        self.preemption_source = ""
        self.ooms_total = 0
        self.oom_unalloc: dict[str, float] = {}  # gpu -> bytes, at the last OOM read
        self.capacity_tokens: float | None = None
        self.capacity_blocks: float | None = None
        self.block_size: int | None = None
        self.stats: dict[str, dict] = {}  # engine label -> last stats fields
        self.saw_v1_stats = False
        self._sum = 0.0  # interval counts (V1 "Preemptions: N") and SGLang retractions

    def apply(self, ev: LogEvent) -> None:
        f = ev.fields
        if ev.kind == "preemption":
            n = float(f["cumulative"])
            if self._v0_last is not None and n < self._v0_last:  # engine restarted: its counter reset
                self._v0_offset += self._v0_last
            self._v0_last = n
            self.preemptions_total = self._v0_offset + n + self._other_preemptions()
            self.preemption_source = "vllm-v0 warnings"
        elif ev.kind == "retraction":
            self._add_preemptions(f["retracted"], "sglang retractions")
        elif ev.kind == "stats":
            self.stats[ev.engine] = f
            if ev.source == "sglang":
                self._add_preemptions(0, "sglang retractions")
            elif "preemptions" in f:
                self._add_preemptions(f["preemptions"] if ev.engine != "all" or not self._per_engine() else 0,
                                      "vllm-v1 stats lines")
            elif ev.source == "vllm-v0":  # V0 warns on the 1st preemption: no warning yet means none
                self._add_preemptions(0, self.preemption_source or "vllm-v0 warnings")
            else:
                self.saw_v1_stats = True
        elif ev.kind == "oom":
            self.ooms_total += 1
            if "reserved_unallocated_bytes" in f:
                self.oom_unalloc[str(f.get("gpu", ""))] = f["reserved_unallocated_bytes"]
        elif ev.kind == "kv_cache_tokens":
            self.capacity_tokens = float(f["tokens"])
        elif ev.kind == "kv_blocks":
            self.capacity_blocks = float(f["gpu_blocks"])
            if self.block_size:
                self.capacity_tokens = self.capacity_blocks * self.block_size
        elif ev.kind == "config" and f.get("block_size"):
            self.block_size = int(f["block_size"])
            if self.capacity_blocks is not None:
                self.capacity_tokens = self.capacity_blocks * self.block_size

    def _per_engine(self) -> bool:
        return any(k not in ("all", "") for k in self.stats)

    def _other_preemptions(self) -> float:
        return self._sum

    def _add_preemptions(self, n: float, source: str) -> None:
        self._sum += float(n)
        v0 = (self._v0_offset + self._v0_last) if self._v0_last is not None else 0.0
        self.preemptions_total = v0 + self._sum
        self.preemption_source = self.preemption_source or source


@dataclass(slots=True)
class _Tail:
    """An open file being followed: identity, read offset, and the partial last line held back."""

    fh: object
    dev: int
    ino: int
    offset: int = 0
    partial: bytes = b""
    head: bytes = b""  # the file's first bytes: a file rewritten in place shows a different head


class LogCollector:
    """Follow an engine log file (``tail -F``) and emit ``fragscope_log_*`` samples.

    ``from_start=False`` starts at the end of the file (only new lines count); a file that appears
    later, or a rotated-in new file, is read from its beginning. Each tick reads at most
    ``max_bytes_per_tick`` bytes; a last line without its newline waits for the next tick (up to
    ``max_line_bytes``, then it is taken as is). Samples carry the collection time ``now``: log
    timestamps have no year and no time zone, so they stay in the events (``diagnose logs``).
    ``collect`` never raises.
    """

    name = "logs"

    def __init__(self, path: str, *, from_start: bool = False, max_bytes_per_tick: int = 1 << 20,
                 max_line_bytes: int = 1 << 16, labels: Mapping[str, str] | None = None,
                 tz: tzinfo | None = None) -> None:
        self.path = os.fspath(path)
        self.from_start = from_start
        self.max_bytes = max(4096, int(max_bytes_per_tick))
        self.max_line = max(1024, int(max_line_bytes))
        self.labels = make_labels(labels)
        self.parser = LogParser(tz=tz)
        self.state = LogState()
        self._tail: _Tail | None = None
        self._first_open = True
        self._down_logged = False
        self.events_read = 0
        self.bytes_read = 0

    # -- file following -----------------------------------------------------------------------
    def _open(self, st: os.stat_result, at_end: bool) -> None:
        fh = open(self.path, "rb")
        st2 = os.fstat(fh.fileno())
        t = _Tail(fh, st2.st_dev, st2.st_ino)
        if at_end:
            t.offset = st2.st_size
            fh.seek(t.offset)
        self._tail = t

    def _close(self) -> None:
        if self._tail is not None:
            try:
                self._tail.fh.close()
            except OSError:
                pass
            self._tail = None

    def _read_lines(self, budget: int) -> tuple[list[str], int]:
        """Read up to ``budget`` bytes from the open file; complete lines only."""
        t = self._tail
        assert t is not None
        t.fh.seek(t.offset)
        data = t.fh.read(budget)
        if not data:
            return [], 0
        if t.offset < self.HEAD_BYTES and len(t.head) == t.offset:  # remember the head as it is read
            t.head = (t.head + data)[:self.HEAD_BYTES]
        t.offset += len(data)
        buf = t.partial + data
        parts = buf.split(b"\n")
        t.partial = parts.pop()
        if len(t.partial) > self.max_line:  # a runaway line without newline: take it, do not grow
            parts.append(t.partial)
            t.partial = b""
        return [p.decode("utf-8", "replace") for p in parts], len(data)

    HEAD_BYTES = 64

    def _same_head(self, t: _Tail) -> bool:
        """Compare the file's first bytes with those seen before (size alone misses a truncation
        followed by more writes than were there). Remembers up to HEAD_BYTES as the file grows."""
        if t.offset == 0:
            return True
        n = min(self.HEAD_BYTES, t.offset)
        try:
            cur = os.pread(t.fh.fileno(), n, 0)
        except (OSError, AttributeError):
            return True
        if t.head and cur[:len(t.head)] != t.head:
            return False
        if len(t.head) < n:
            t.head = cur
        return True

    def _flush_partial(self) -> list[str]:
        t = self._tail
        if t is None or not t.partial:
            return []
        line, t.partial = t.partial.decode("utf-8", "replace"), b""
        return [line]

    def read_new_lines(self) -> list[str]:
        """Lines appended since the last call (rotation and truncation handled). Raises OSError."""
        lines: list[str] = []
        budget = self.max_bytes
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._first_open = False  # a file that appears later is read from its beginning
            if self._tail is not None:  # rotated away and not yet replaced: drain the old file
                more, n = self._read_lines(budget)
                lines += more + self._flush_partial()
                self._close()
                return lines
            raise
        if self._tail is None:
            self._open(st, at_end=self._first_open and not self.from_start)
            self._first_open = False
        t = self._tail
        if (st.st_dev, st.st_ino) != (t.dev, t.ino):
            # rotated (rename + new file): finish the old one, then read the new one from the start
            more, n = self._read_lines(budget)
            budget -= n
            if n < self.max_bytes and budget > 0:
                lines += more + self._flush_partial()
                self._close()
                self._open(st, at_end=False)
            else:
                return more  # old file still has more than a tick's worth
        elif st.st_size < t.offset or not self._same_head(t):  # truncated or rewritten in place (copytruncate)
            t.offset, t.partial, t.head = 0, b"", b""
        if budget > 0:
            more, _ = self._read_lines(budget)
            lines += more
        return lines

    # -- collector ----------------------------------------------------------------------------
    def collect(self, now: float) -> CollectResult:
        try:
            return self._collect(now)
        except Exception as e:  # never raise into the agent
            self._close()
            return self._down(now, Reason.PARSE_ERROR, f"{self.path}: {type(e).__name__}: {e}")

    def _down(self, now: float, reason: Reason, detail: str) -> CollectResult:
        if not self._down_logged:
            log.warning("logs collector: %s", detail)
            self._down_logged = True
        miss = [Missing(n, self.labels, now, reason, detail) for n in SIGNAL_NAMES]
        return CollectResult(missing=miss, up=False, error=detail)

    def _collect(self, now: float) -> CollectResult:
        self.parser.set_reference(now)
        try:
            lines = self.read_new_lines()
        except FileNotFoundError:
            return self._down(now, Reason.SOURCE_DOWN, f"log file {self.path} not found")
        except PermissionError:
            self._close()
            return self._down(now, Reason.NO_PERMISSION, f"log file {self.path}: permission denied")
        except IsADirectoryError:
            return self._down(now, Reason.SOURCE_DOWN, f"log file {self.path} is a directory")
        if self._down_logged:
            log.info("logs collector: %s readable again", self.path)
            self._down_logged = False
        self.bytes_read += sum(len(x) + 1 for x in lines)
        st = self.state
        new_oom = False
        stats_engines: set[str] = set()
        for line in lines:
            for ev in self.parser.feed(line):
                self.events_read += 1
                st.apply(ev)
                if ev.kind == "oom":
                    new_oom = True
                elif ev.kind == "stats":
                    stats_engines.add(ev.engine)
        return CollectResult(samples=self._samples(now, new_oom, stats_engines), missing=self._missing(now))

    def _lab(self, **extra: str) -> tuple:
        return make_labels(dict(self.labels) | {k: v for k, v in extra.items() if v})

    def _samples(self, now: float, new_oom: bool, stats_engines: set[str]) -> list[Sample]:
        st = self.state
        out = [Sample(M_OOMS, self.labels, now, float(st.ooms_total))]
        if st.preemptions_total is not None:
            out.append(Sample(M_PREEMPTIONS, self.labels, now, st.preemptions_total))
        if st.capacity_tokens is not None:
            out.append(Sample(M_KV_CAPACITY, self.labels, now, st.capacity_tokens))
        if st.capacity_blocks is not None:
            out.append(Sample(M_KV_BLOCKS, self.labels, now, st.capacity_blocks))
        if new_oom:
            for gpu, v in st.oom_unalloc.items():
                out.append(Sample(M_OOM_UNALLOC, self._lab(gpu=gpu), now, v))
        for eng in sorted(stats_engines):
            f = st.stats.get(eng, {})
            lab = self._lab(engine=eng)
            for name, key in ((M_RUNNING, "running"), (M_WAITING, "waiting"), (M_KV_USAGE, "kv_usage_ratio"),
                              (M_GEN_TPS, "generation_tps")):
                if key in f:
                    out.append(Sample(name, lab, now, float(f[key])))
        return out

    def _missing(self, now: float) -> list[Missing]:
        st = self.state
        if st.preemptions_total is None and st.saw_v1_stats:
            return [Missing(M_PREEMPTIONS, self.labels, now, Reason.NOT_EXPOSED,
                            "this vLLM version does not log preemptions; read vllm:num_preemptions_total")]
        return []

    def close(self) -> None:
        self._close()


def iter_file_lines(path: str) -> Iterator[str]:
    """Lines of a log file (.gz too), undecodable bytes replaced. Raises OSError."""
    import gzip

    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as g:
            yield from g
    else:
        with open(path, "r", encoding="utf-8", errors="replace") as fh2:
            yield from fh2
