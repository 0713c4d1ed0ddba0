"""The table of message patterns: which engine line becomes which event, with which fields.

One :class:`Rule` per message shape, tried in order (vLLM file:function in comments; formats in
../shared/notes/metrics-and-logs.md). A rule applies when one of its ``gates`` (cheap substrings)
is in the message and its ``pattern`` matches; ``build`` turns the match into fields (base units).
An exclusive rule ends the search for that message. Fields are matched one by one inside a message,
so reordered or added fields do not break parsing. A figure that is not a finite, bounded number
(see events.NUM) leaves its field out; a rule whose required figure is bad yields no event.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Callable

from .crashes import ENGINE_DEAD, NCCL_TIMEOUT, RAY_KILLED, RAY_OOM, engine_dead, nccl_timeout, ray_oom
from .events import GIB, INT, NUM, SIZE, BadNumber, Fields, opt_field as _opt, parse_size, to_float, to_int

# A size vLLM can print below zero (the KV pool when nothing is left: "Available KV cache memory: -0.5 GiB"):
# three groups, sign ("" or "-"), number, unit.
SSIZE = r"(-?)" + SIZE


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str
    gates: tuple[str, ...]
    pattern: re.Pattern
    build: Callable[[re.Match, str], tuple[Fields, str] | None]  # -> (fields, engine) or None
    source: str
    exclusive: bool = True


def _opt_size(fields: Fields, key: str, rx: re.Pattern, msg: str) -> None:
    g = rx.search(msg)
    if g:
        try:
            fields[key] = signed_size(g)
        except BadNumber:
            pass


def signed_size(m: re.Match, i: int = 1) -> float:
    """Bytes from a SIZE match at group ``i``; a SSIZE wording (three groups: sign, number, unit) keeps its sign."""
    if m.re.groups - i + 1 == 3 and m.group(i) in ("", "-"):
        v = parse_size(m.group(i + 1), m.group(i + 2))
        return -v if m.group(i) == "-" else v
    return parse_size(m.group(i), m.group(i + 1))


def _ratio_pct(s: str) -> float:
    return round(to_float(s) / 100.0, 6)


# --- preemption / retraction -----------------------------------------------------------------
# V0 core/scheduler.py::_preempt, WARNING on the 1st and every 50th preemption
_PREEMPT = re.compile(r"(?:Sequence group|Request) (\S{1,200}) is preempted (?:by|in) PreemptionMode\.(\w{1,20})")
_PREEMPT_COUNT = re.compile(r"(?:total_num_cumulative_preemption|total_cumulative_preemption_cnt)=" + INT)


def _preempt(m: re.Match, msg: str):
    # the count follows within the same sentence; searched from the head's end (linear, no backtracking)
    c = _PREEMPT_COUNT.search(msg, m.end(), m.end() + 2000)
    if c is None:
        return None
    return {"request_id": m.group(1), "mode": m.group(2).lower(), "cumulative": to_int(c.group(1))}, ""


# SGLang scheduler: "KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 646, ..."
_RETRACT = re.compile(r"Retract requests\. #retracted_reqs: " + INT)
_RETRACT_GAINED = re.compile(r"#new_tokens_gained: " + INT)
_RETRACT_RATIO = re.compile(r"#new_token_ratio: " + NUM + " -> " + NUM)


def _retract(m: re.Match, msg: str):
    f: Fields = {"retracted": to_int(m.group(1))}
    _opt(f, "new_tokens_gained", _RETRACT_GAINED, msg, to_int)
    r = _RETRACT_RATIO.search(msg)
    if r:
        try:
            f["new_token_ratio_before"], f["new_token_ratio_after"] = to_float(r.group(1)), to_float(r.group(2))
        except BadNumber:
            pass
    return f, ""


# --- stats lines (V0 metrics.py, V1 loggers.py) ----------------------------------------------
_ENGINE = re.compile(r"^(?:Engine (\d{1,6})|(\d{1,6}) Engines Aggregated):")
_STATS_FIELDS = (("prompt_tps", re.compile(r"Avg prompt throughput: " + NUM + " tokens/s"), to_float),
                 ("generation_tps", re.compile(r"Avg generation throughput: " + NUM + " tokens/s"), to_float),
                 ("running", re.compile(r"Running: " + INT + " reqs"), to_int),
                 ("waiting", re.compile(r"(?:Waiting|Pending): " + INT + " reqs"), to_int),
                 ("swapped", re.compile(r"Swapped: " + INT + " reqs"), to_int),
                 ("preemptions", re.compile(r"Preemptions: " + INT), to_int),
                 ("prefix_cache_hit_ratio", re.compile(r"(?<!External )(?<!MM )Prefix cache hit rate: " + NUM + "%"),
                  _ratio_pct))
_F_KV_USAGE = re.compile(r"\b(GPU|CPU|XPU|TPU|HPU|NPU) KV cache usage: " + NUM + "%")
_STATS = re.compile(r"Avg (?:prompt|generation) throughput:")


def _stats(m: re.Match, msg: str):
    f: Fields = {}
    engine = ""
    e = _ENGINE.match(msg)
    if e:
        engine = (e.group(1).lstrip("0") or "0") if e.group(1) is not None else "all"
        if e.group(2) is not None:
            f["engines"] = int(e.group(2))
    for key, rx, conv in _STATS_FIELDS:
        _opt(f, key, rx, msg, conv)
    usages = _F_KV_USAGE.findall(msg)
    if usages:  # V0 prints GPU then CPU (swap space); V1 prints the pool's device only
        dev, pct = next(((d, p) for d, p in usages if d == "GPU"), usages[0])
        try:
            f["kv_usage_ratio"] = _ratio_pct(pct)
            f["device"] = dev.lower()
        except BadNumber:
            pass
    return f, engine


# SGLang "Decode batch, #running-req: 66, #token: 84642, token usage: 0.97, cuda graph: False,
# gen throughput (token/s): 2574.67, #queue-req: 11" (older: "Decode batch. ..."), and "Prefill batch. ..."
_SG_BATCH = re.compile(r"^(Decode|Prefill) batch[.,]")
_SG_FIELDS = (("running", re.compile(r"#running-req: " + INT), to_int),
              ("tokens", re.compile(r"#token: " + INT), to_int),
              ("kv_usage_ratio", re.compile(r"(?<!swa )token usage: " + NUM), to_float),
              ("generation_tps", re.compile(r"gen throughput \(token/s\): " + NUM), to_float),
              ("waiting", re.compile(r"#queue-req: " + INT), to_int))


def _sg_batch(m: re.Match, msg: str):
    f: Fields = {"phase": m.group(1).lower()}
    for key, rx, conv in _SG_FIELDS:
        _opt(f, key, rx, msg, conv)
    return (f, "") if len(f) > 1 else None


# --- PyTorch OOM, three generations (notes section 5) ----------------------------------------
_OOM = re.compile(r"\b(CUDA|HIP|NPU|XPU|MPS) out of memory\. Tried to allocate " + SIZE)
_OOM_OLD_DEV = re.compile(r"\((GPU|NPU|XPU) (\d{1,4}); ")
_OOM_OLD = (("total_bytes", re.compile(SIZE + r" total capacity")),
            ("allocated_bytes", re.compile(SIZE + r" already allocated")),
            ("free_bytes", re.compile(SIZE + r" free")),
            ("reserved_bytes", re.compile(SIZE + r" (?:reserved in total by PyTorch|cached)")))
_OOM_NEW_HEAD = re.compile(r"(GPU|NPU|XPU) (\d{1,4}) has a total capac(i?)ty of " + SIZE + r" of which " + SIZE + r" is free")
_OOM_NEW_PROC = re.compile(r"Process (\d{1,10}) has " + SIZE + r" memory in use")
_OOM_NEW = (("process_in_use_bytes", re.compile(r"this process has " + SIZE + r" memory in use")),
            ("allocated_bytes", re.compile(r"Of the allocated memory " + SIZE + r" is allocated by PyTorch")),
            ("reserved_unallocated_bytes", re.compile(SIZE + r" is reserved by PyTorch but unallocated")),
            ("private_pool_bytes", re.compile(SIZE + r" (?:is )?allocated (?:by PyTorch )?in private pools")))
_OOM_RUNTIME = re.compile(r"\b(CUDA|HIP) error: out of memory")


def _oom(m: re.Match, msg: str):
    f: Fields = {"device_type": m.group(1), "requested_bytes": parse_size(m.group(2), m.group(3))}
    new = _OOM_NEW_HEAD.search(msg)
    if new:
        f["wording"] = "2.1" if new.group(3) == "" else ">=2.2"  # 2.1 printed "total capacty"
        f["gpu"] = new.group(2)
        try:
            f["total_bytes"] = parse_size(new.group(4), new.group(5))
            f["free_bytes"] = parse_size(new.group(6), new.group(7))
        except BadNumber:
            pass
        others = []
        for p, n, u in _OOM_NEW_PROC.findall(msg):
            try:
                others.append({"pid": int(p), "bytes": parse_size(n, u)})
            except BadNumber:
                pass
        if others:
            f["other_processes"] = others
        for key, rx in _OOM_NEW:
            _opt_size(f, key, rx, msg)
        if "allocated_bytes" in f and "reserved_unallocated_bytes" in f:
            f["reserved_bytes"] = f["allocated_bytes"] + f["reserved_unallocated_bytes"]
        return f, ""
    f["wording"] = "<=2.0"
    d = _OOM_OLD_DEV.search(msg)
    if d:
        f["gpu"] = d.group(2)
    # restrict to the parenthesised detail so "Tried to allocate" is not read as a figure
    detail = msg[d.end():] if d else msg[m.end():]
    for key, rx in _OOM_OLD:
        _opt_size(f, key, rx, detail)
    if "reserved_bytes" in f and "allocated_bytes" in f:
        # <=2.0 prints reserved and allocated; their difference is the same figure 2.1+ prints directly
        f["reserved_unallocated_bytes"] = max(0.0, f["reserved_bytes"] - f["allocated_bytes"])
        f["reserved_unallocated_derived"] = True
    return f, ""


# PyTorch's cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; ComfyUI's default) words its
# OOM on several lines (c10/cuda/CUDAMallocAsyncAllocator.cpp): "Allocation on device N would exceed allowed memory.
# (out of memory)" then "Currently allocated : X", "Requested : X", "Device limit : X", "Free (according to CUDA): X",
# "PyTorch limit (set by user-supplied memory fraction)" and, on the next line, ": X". There is no reserved figure:
# freed blocks go back to CUDA's memory pool, not to a PyTorch cache.
_OOM_ASYNC = re.compile(r"Allocation on device (\d{1,4}) would exceed allowed memory\. \(out of memory\)")
ASYNC_OOM_FIELDS = (("allocated_bytes", re.compile(r"Currently allocated {0,40}: {0,40}" + SIZE)),
                    ("requested_bytes", re.compile(r"Requested {0,40}: {0,40}" + SIZE)),
                    ("total_bytes", re.compile(r"Device limit {0,40}: {0,40}" + SIZE)),
                    ("free_bytes", re.compile(r"Free \(according to CUDA\) {0,40}: {0,40}" + SIZE)),
                    ("memory_limit_bytes", re.compile(r"memory fraction\) {0,40}: {0,40}" + SIZE)))
_ASYNC_LIMIT_VALUE = re.compile(r"^\s{0,60}: {0,40}" + SIZE)  # the limit's value on a line of its own
ASYNC_OOM_LABEL = "set by user-supplied memory fraction)"


def _oom_async(m: re.Match, msg: str):
    f: Fields = {"wording": "cuda-malloc-async", "device_type": "CUDA", "gpu": m.group(1)}
    fill_async_oom(f, msg[m.end():])
    return f, ""


def fill_async_oom(f: Fields, text: str) -> bool:
    """Add the figures of a cudaMallocAsync OOM found in ``text`` (its own line, or a line that follows the
    header); True when ``text`` held one. A lone ": X" line is the limit when the label came last."""
    found = False
    for key, rx in ASYNC_OOM_FIELDS:
        if key in f:
            continue
        m = rx.search(text)
        if m:
            try:
                f[key] = parse_size(m.group(1), m.group(2))
                found = True
            except BadNumber:
                pass
    if not found and "memory_limit_bytes" not in f and f.get("_limit_label"):
        m = _ASYNC_LIMIT_VALUE.search(text)
        if m:
            try:
                f["memory_limit_bytes"] = parse_size(m.group(1), m.group(2))
                found = True
            except BadNumber:
                pass
    if ASYNC_OOM_LABEL in text and "memory_limit_bytes" not in f:
        f["_limit_label"] = True
        found = True
    if "memory_limit_bytes" in f:
        f.pop("_limit_label", None)
    return found


def async_oom_complete(f: Fields) -> bool:
    return f.get("wording") != "cuda-malloc-async" or "memory_limit_bytes" in f


def _oom_runtime(m: re.Match, msg: str):
    return {"wording": "cuda-error", "device_type": m.group(1)}, ""


# --- startup capacity ------------------------------------------------------------------------
# The one source of the start-up wordings both readers share: this collector and the sizing parser
# (fragscope/sizing/wordings.py imports them; group layouts are part of that contract).
KV_TOKENS = re.compile(r"\b(GPU|CPU|XPU|TPU|HPU|NPU) KV cache size: " + INT + " tokens")  # 1 device, 2 tokens
MAX_CONC = re.compile(r"Maximum concurrency for " + INT + " tokens per request: " +
                       r"(\d{1,3}(?:,\d{3}){1,4}(?:\.\d{1,6})?|\d{1,12}(?:\.\d{1,6})?)x")  # 1 tokens, 2 times
# V0 "# GPU blocks: 2627, # CPU blocks: 327"; the CPU count is absent in some releases and the Ray/XPU
# executors print "# cuda blocks" (1 device, 2 blocks, 3 CPU blocks or None)
BLOCKS = re.compile(r"# (GPU|CUDA|NPU|XPU|TPU|HPU) blocks: " + INT + r"(?:, # CPU blocks: " + INT + r")?",
                     re.IGNORECASE)
AVAIL_KV = re.compile(r"Available KV cache memory: " + SSIZE)
WEIGHTS = re.compile(r"(?:Loading model weights took|Model loading took) " + SIZE)
GRAPH = re.compile(r"Graph capturing finished in " + NUM + r" secs?(?:, took " + SIZE + r")?")  # 1 s, 2-3 size
# V0 worker.py "Memory profiling results: total_gpu_memory=63.43GiB ... gpu_memory_utilization=0.90"
PROFILE_KEYVALUE = (
    ("total_gpu_memory_bytes", re.compile(r"total_gpu_memory=" + SIZE)),
    ("initial_memory_usage_bytes", re.compile(r"initial_memory_usage=" + SIZE)),
    ("peak_torch_memory_bytes", re.compile(r"peak_torch_memory=" + SIZE)),
    ("non_torch_memory_bytes", re.compile(r"non_torch_memory=" + SIZE)),
    ("kv_cache_bytes", re.compile(r"kv_cache_size=" + SSIZE)),
)
# later V0 (0.6.4+) and V1 wording of the same profile, one or several lines
PROFILE_PROSE = (
    ("total_gpu_memory_bytes", re.compile(r"total_gpu_memory \(" + SIZE + r"\)")),
    ("weights_bytes", re.compile(r"model weights take " + SIZE)),
    ("non_torch_memory_bytes", re.compile(r"non_torch_memory takes " + SIZE)),
    ("activation_peak_bytes", re.compile(r"PyTorch activation peak memory takes " + SIZE)),
    ("kv_cache_bytes", re.compile(r"(?:the rest of the memory reserved for KV Cache is|reserved for KV Cache is) " + SSIZE)),
)
_PROFILE = PROFILE_KEYVALUE + PROFILE_PROSE
_PROFILE_ANY = re.compile(r"Memory profiling results|model weights take|reserved for KV Cache|non_torch_memory takes")
_GMU = re.compile(r"gpu_memory_utilization(?:=| \()" + NUM)
_CONFIG = (("block_size", re.compile(r"\bblock_size=" + INT), to_int),
           ("gpu_memory_utilization", _GMU, to_float),
           ("max_model_len", re.compile(r"\b(?:max_model_len|max_seq_len)=" + INT), to_int),
           ("tensor_parallel_size", re.compile(r"\btensor_parallel_size=" + INT), to_int),
           ("kv_cache_dtype", re.compile(r"\bkv_cache_dtype=['\"]?([\w.]{1,40})"), str))
_CONFIG_ANY = re.compile(r"block_size=|gpu_memory_utilization=")
# V1 gpu_worker.py init_device ValueError
SHORTFALL = re.compile(r"Free memory on device(?: \S{1,40})? \(" + NUM + "/" + NUM + r" GiB\) on startup is less than "
                        r"desired GPU memory utilization \(" + NUM + ", " + NUM + r" GiB\)")
KV_INSUFF = re.compile(r"max seq len \(" + INT + r"\), \(?" + NUM + r" GiB\)? KV cache is needed, which is larger "
                        r"than the available KV cache memory \(" + NUM + r" GiB\)")
KV_INSUFF_EST = re.compile(r"estimated maximum model length is " + INT)


def _kv_tokens(m, msg):
    return {"tokens": to_int(m.group(2)), "device": m.group(1).lower()}, ""


def _max_conc(m, msg):
    return {"tokens_per_request": to_int(m.group(1)), "concurrency": to_float(m.group(2))}, ""


def _blocks(m, msg):
    return {"gpu_blocks": to_int(m.group(2)), "cpu_blocks": None if m.group(3) is None else to_int(m.group(3))}, ""


def _size_field(key):
    return lambda m, msg: ({key: signed_size(m)}, "")


def _graph(m, msg):
    f: Fields = {"seconds": to_float(m.group(1))}
    if m.group(2) is not None:
        try:
            f["cuda_graph_bytes"] = parse_size(m.group(2), m.group(3))
        except BadNumber:
            pass
    return f, ""


def _shortfall(m, msg):
    return {"free_bytes": to_float(m.group(1)) * GIB, "total_bytes": to_float(m.group(2)) * GIB,
            "gpu_memory_utilization": to_float(m.group(3)), "requested_bytes": to_float(m.group(4)) * GIB}, ""


def _kv_insuff(m, msg):
    f: Fields = {"max_model_len": to_int(m.group(1)), "needed_bytes": to_float(m.group(2)) * GIB,
                 "available_bytes": to_float(m.group(3)) * GIB}
    _opt(f, "estimated_max_model_len", KV_INSUFF_EST, msg, to_int)
    return f, ""


def _profile(m, msg):
    f: Fields = {}
    for key, rx in _PROFILE:
        if key not in f:
            _opt_size(f, key, rx, msg)
    _opt(f, "gpu_memory_utilization", _GMU, msg, to_float)
    return (f, "") if f else None


def _config(m, msg):
    if "Namespace(" not in msg and "config" not in msg:
        return None
    f: Fields = {}
    for key, rx, conv in _CONFIG:
        _opt(f, key, rx, msg, conv)
    return (f, "") if f else None


RULES: tuple[Rule, ...] = (
    Rule("preemption", ("cumulative_preemption",), _PREEMPT, _preempt, "vllm-v0"),
    Rule("retraction", ("Retract requests",), _RETRACT, _retract, "sglang"),
    Rule("stats", ("throughput:",), _STATS, _stats, "vllm"),  # source: vllm-v0 / vllm-v1, set in parse_message
    Rule("stats", ("batch",), _SG_BATCH, _sg_batch, "sglang"),
    Rule("oom", ("out of memory",), _OOM, _oom, "torch"),
    Rule("oom", ("out of memory",), _OOM_RUNTIME, _oom_runtime, "torch"),
    Rule("oom", ("would exceed allowed memory",), _OOM_ASYNC, _oom_async, "torch"),
    Rule("kv_cache_tokens", ("KV cache size",), KV_TOKENS, _kv_tokens, "vllm-v1", exclusive=False),
    Rule("max_concurrency", ("Maximum concurrency",), MAX_CONC, _max_conc, "vllm"),
    Rule("kv_blocks", ("blocks:",), BLOCKS, _blocks, "vllm-v0"),
    Rule("kv_memory", ("Available KV cache memory",), AVAIL_KV, _size_field("kv_cache_bytes"), "vllm-v1"),
    Rule("weights", ("weights took", "loading took"), WEIGHTS, _size_field("weights_bytes"), "vllm"),
    Rule("cuda_graph", ("Graph capturing",), GRAPH, _graph, "vllm"),
    Rule("startup_memory_shortfall", ("Free memory on device",), SHORTFALL, _shortfall, "vllm-v1"),
    Rule("kv_insufficient", ("KV cache is needed",), KV_INSUFF, _kv_insuff, "vllm"),
    Rule("memory_profile", ("profiling", "model weights take", "KV Cache is", "non_torch_memory"), _PROFILE_ANY,
         _profile, "vllm-v0"),
    Rule("config", ("block_size=", "gpu_memory_utilization="), _CONFIG_ANY, _config, "vllm"),
    Rule("collective_timeout", ("collective operation timeout",), NCCL_TIMEOUT, nccl_timeout, "torch"),
    Rule("host_oom_kill", ("exceeds the memory usage threshold",), RAY_OOM, ray_oom, "ray"),
    Rule("host_oom_kill", ("killed due to memory pressure",), RAY_KILLED, ray_oom, "ray"),
    Rule("engine_dead", ("entire process down",), ENGINE_DEAD, engine_dead, "torch"),  # PyTorch's own words
    Rule("engine_dead", ("EngineDeadError", "Engine background task failed", "died, exit code", "EngineCore ",
                         "Engine core initialization failed"), ENGINE_DEAD,
         engine_dead, "vllm"),
)
# one C-level scan for every gate at once: most lines (request logs, tracebacks) stop here
_ALL_GATES = re.compile("|".join(re.escape(g) for g in sorted({g for r in RULES for g in r.gates})))


_SEEN: dict[str, list] = {}  # message -> its events: logs repeat lines (progress bars, identical warnings)
_SEEN_MAX = 4096
_SEEN_MAX_CHARS = 1024


def parse_message(msg: str) -> list[tuple[str, Fields, str, str]]:
    """Events in one cleaned message: (kind, fields, engine, source).

    A message seen before gets its events from a bounded cache, as fresh copies (callers keep the fields):
    a log of one line repeated (a progress bar, a gzip bomb of it) cost ~25 µs a line through every rule."""
    hit = _SEEN.get(msg)
    if hit is not None:
        return _fresh(hit) if hit else []
    out = _parse_message(msg)
    if len(msg) <= _SEEN_MAX_CHARS:  # bounded: at most 4096 x 1 KB of keys
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        _SEEN[msg] = _fresh(out)
    return out


def _fresh(events: list) -> list:
    """A copy of ``events`` the caller may change: each fields dict copied, its few list or dict values deep
    (most are numbers and names). copy.deepcopy of every event was ~40 us a repeated line, a third of a
    repeated log's parse."""
    return [(kind, {k: copy.deepcopy(v) if isinstance(v, (list, dict)) else v for k, v in fields.items()},
             engine, source) for kind, fields, engine, source in events]


def _parse_message(msg: str) -> list[tuple[str, Fields, str, str]]:
    if _ALL_GATES.search(msg) is None:
        return []
    out: list[tuple[str, Fields, str, str]] = []
    for rule in RULES:
        if not any(g in msg for g in rule.gates):
            continue
        m = rule.pattern.search(msg)
        if m is None:
            continue
        try:
            built = rule.build(m, msg)
        except (BadNumber, OverflowError, ValueError):
            built = None
        if built is None:
            continue
        fields, engine = built
        source = rule.source
        if rule.kind == "stats" and source == "vllm":
            source = "vllm-v1" if (engine or "Waiting:" in msg) else "vllm-v0"
        out.append((rule.kind, fields, engine, source))
        if rule.exclusive:
            break
    return out
