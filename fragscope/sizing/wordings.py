"""The wordings the start-up parser reads: one regular expression per engine line, and the line gate.

vLLM V0 / V1 and SGLang, with the release each wording comes from (docs/sizing.md has the table).
The wordings the log collector also reads (capacity, blocks, the memory profile, graph capture, start-up
failures) come from :mod:`fragscope.collectors.enginelog.patterns`, their one source; the ones only sizing
needs are here. Sizes go through :func:`fragscope.collectors.enginelog.parse_size` (binary units: the
engines print "GB" for GiB).
"""
from __future__ import annotations

import re

from ..collectors.enginelog import parse_size
from ..collectors.enginelog.patterns import (AVAIL_KV, BLOCKS, GRAPH, KV_INSUFF, KV_INSUFF_EST,  # noqa: F401
                                             KV_TOKENS, MAX_CONC, SHORTFALL, WEIGHTS, PROFILE_KEYVALUE,
                                             PROFILE_PROSE, signed_size)
from ..units import GiB as GIB

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUM = r"(-?\d[\d,]*(?:\.\d+)?)"
_UNIT = r"\s*(bytes|B|KiB|KB|MiB|MB|GiB|GB|TiB|TB)\b"
_SIZE = _NUM + _UNIT


def size_of_match(m: re.Match, i: int = 1) -> float:
    num = m.group(i)
    neg = num.startswith("-")
    v = parse_size(num.lstrip("-"), m.group(i + 1))
    return -v if neg else v


def signed_size_of_match(m: re.Match, i: int = 1) -> float:
    """A size from a shared wording (collectors.enginelog.patterns), signed where vLLM can print it below 0."""
    return signed_size(m, i)


def int_with_commas(s: str) -> int:
    return int(s.replace(",", ""))


def gib_with_commas(s: str) -> float:
    return float(s.replace(",", "")) * GIB


# ---------------------------------------------------------------------------------------------
# vLLM wordings. V0 0.6.4 (PR #10511 era, a table), V0 0.6.5-0.8 (prose, worker.py), older V0
# (key=value), V1 (gpu_worker.py / kv_cache_utils.py), V1 >= 0.21 (CUDA-graph estimate and the
# one-line "Free memory on device ... on startup." summary).
V0_PROSE_BUDGET = re.compile(r"total_gpu_memory \(" + _SIZE + r"\) x gpu_memory_utilization \(([\d.]+)\) = " + _SIZE)
V0_TABLE = {  # "INFO ... worker.py:243] total_gpu_memory     79.22GiB" under "Memory profiling results:"
    "total_gpu_memory_bytes": re.compile(r"\btotal_gpu_memory\s+" + _SIZE),
    "requested_memory_bytes": re.compile(r"the current vLLM instance can use\s+" + _SIZE),
    "weights_bytes": re.compile(r"model weights take\s+" + _SIZE),
    "non_torch_memory_bytes": re.compile(r"\bnon_torch_memory\s+" + _SIZE),
    "activation_peak_bytes": re.compile(r"PyTorch activation peak memory\s+" + _SIZE),
    "kv_cache_bytes": re.compile(r"available_kv_cache_memory\s+" + _SIZE),
}
V0_TABLE_GMU = re.compile(r"\bgpu_memory_utilization\s+([\d.]+)\s*$")
V0_KV = {k: rx for k, rx in PROFILE_KEYVALUE if k != "initial_memory_usage_bytes"}
V0_KV_GMU = re.compile(r"gpu_memory_utilization=([\d.]+)")
V0_PROSE = {k: rx for k, rx in PROFILE_PROSE if k != "total_gpu_memory_bytes"}  # the total: V0_PROSE_BUDGET
GRAPH_EST = re.compile(r"Estimated CUDA graph memory: " + _SIZE)
GRAPH_POOL = re.compile(r"CUDA graph pool memory: " + _SIZE + r" \(actual\), " + _SIZE + r" \(estimated\)")
GRAPH_PROFILING_ON = re.compile(r"current --gpu-memory-utilization=([\d.]+) is equivalent to "
                                 r"--gpu-memory-utilization=([\d.]+) without CUDA graph memory profiling")
GRAPH_PROFILING_OFF = "CUDA graph memory profiling is disabled"
# V1 >= 0.2x gpu_worker.py: one line after graph capture
SUMMARY_FREE = re.compile(r"Free memory on device(?: \S+)? \(([\d.,]+)/([\d.,]+) GiB\) on startup\. ")
SUMMARY_DESIRED = re.compile(r"Desired GPU memory utilization is \(([\d.]+), ([\d.,]+) GiB\)")
SUMMARY_PARTS = {
    "consumed_memory_bytes": re.compile(r"([\d.,]+) GiB for consumed memory"),
    "weights_bytes": re.compile(r"([\d.,]+) GiB for weights?\b"),
    "activation_peak_bytes": re.compile(r"([\d.,]+) GiB for peak activation"),
    "non_torch_memory_bytes": re.compile(r"([\d.,]+) GiB for non-torch memory"),
    "cuda_graph_bytes": re.compile(r"([\d.,]+) GiB for CUDAGraph memory"),
}
SUMMARY_FIT = re.compile(r"`--kv-cache-memory(?:-bytes)?=(\d+)`[^`]*?to fit into requested memory")
SUMMARY_FULL = re.compile(r"`--kv-cache-memory(?:-bytes)?=(\d+)`[^`]*?to fully utilize gpu memory")
SUMMARY_INUSE = re.compile(r"Current kv cache memory in use is ([\d.,]+) GiB")
# failures at start-up (SHORTFALL, KV_INSUFF, KV_INSUFF_EST: collectors.enginelog.patterns)
NO_CACHE = re.compile(r"No available memory for the cache blocks|Not enough memory\. Please try to increase "
                       r"--mem-fraction-static")
# V0 (2023-24): "The model's max seq len (4096) is larger than the maximum number of tokens that can be stored
# in KV cache (3664)."
KV_INSUFF_OLD = re.compile(r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored "
                            r"in KV cache \((\d+)\)")
# configuration echoes: Namespace(...), "non-default args: {...}", "Initializing a V0 LLM engine (v0.7.2) with config:"
CFG = {
    "gpu_memory_utilization": (re.compile(r"['\"]?gpu_memory_utilization['\"]?\s*[:=]\s*([\d.]+)"), float),
    "max_model_len": (re.compile(r"['\"]?(?:max_model_len|max_seq_len)['\"]?\s*[:=]\s*(\d+)"), int),
    "max_num_seqs": (re.compile(r"['\"]?max_num_seqs['\"]?\s*[:=]\s*(\d+)"), int),
    "block_size": (re.compile(r"['\"]?block_size['\"]?\s*[:=]\s*(\d+)"), int),
    "tensor_parallel_size": (re.compile(r"['\"]?(?:tensor_parallel_size|tp_size)['\"]?\s*[:=]\s*(\d+)"), int),
    "kv_cache_memory_bytes": (re.compile(r"['\"]?kv_cache_memory(?:_bytes)?['\"]?\s*[:=]\s*(\d+)"), int),
    "mem_fraction_static": (re.compile(r"['\"]?mem_fraction_static['\"]?\s*[:=]\s*([\d.]+)"), float),
    "page_size": (re.compile(r"\bpage_size['\"]?\s*[:=]\s*(\d+)"), int),
}
VERSION = re.compile(r"vLLM API server version:? v?([\w.+\-]+)|Initializing an? (?:V[01] )?LLM engine \(v([\w.+\-]+)\)"
                      r"|█\s+version\s+([\w.+\-]+)")
ENGINE_V = re.compile(r"Initializing an? (V[01]) LLM engine")

# SGLang (scheduler / model_runner / cuda_graph_runner)
SG_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=" + _SIZE)
SG_LOAD_END = re.compile(r"Load weight end\..*?avail mem=" + _SIZE + r", mem usage=" + _SIZE)
SG_KV = re.compile(r"KV Cache is allocated\.(?: dtype: [\w.]+,)? #tokens: ([\d,]+), K size: " + _SIZE +
                    r", V size: " + _SIZE)
SG_POOL_END = re.compile(r"Memory pool end\. avail mem=" + _SIZE)
# "Capture cuda graph begin. This can take up to several minutes. avail mem=13.95 GB": after workspaces, before graphs
SG_GRAPH_BEGIN = re.compile(r"Capture cuda graph begin\..{0,80}?avail mem=" + _SIZE)
SG_GRAPH_BEGIN = re.compile(r"Capture cuda graph begin\..*?avail mem=" + _SIZE)
SG_GRAPH_END = re.compile(r"Capture cuda graph end\. Time elapsed: ([\d.]+) s\.(?: mem usage=" + _SIZE +
                           r"\.)?(?: avail mem=" + _SIZE + r")?")
SG_MAX_TOTAL = re.compile(r"max_total_num_tokens=(\d+)")
SG_FIELDS = {
    "max_running_requests": re.compile(r"max_running_requests=(\d+)"),
    "context_len": re.compile(r"context_len=(\d+)"),
}
SG_AVAIL = re.compile(r"available_gpu_mem=" + _SIZE)

# where a failure happened: the latest marker before it (traceback frames win: they are specific)
PHASES = (  # (phase, substrings); checked in this order
    ("graph-capture", ("Capturing CUDA graph", "Capturing cudagraphs", "Capturing the model for CUDA graphs",
                       "Capture cuda graph begin", "Capturing batches", "capture_model", "capture_end",
                       "torch.cuda.graph(", "Profiling CUDA graph memory", "cuda_graph_runner")),
    ("profile", ("profile_run", "determine_available_memory", "determine_num_available_blocks", "_dummy_run",
                 "Memory profiling", "profile_max_num_token")),
    ("kv-allocation", ("initialize_kv_cache", "_allocate_kv_cache", "init_memory_pool", "initialize_cache",
                       "_init_cache_engine", "allocate_kv_cache")),
    ("load", ("load_model", "Loading model weights", "Starting to load model", "Load weight begin",
              "Loading safetensors checkpoint")),
)
READY = ("Application startup complete", "Starting vLLM API server", "Started server process",
          "The server is fired up and ready to roll", "Avg prompt throughput", "Decode batch", "Prefill batch",
          "Uvicorn running on")
NEW_STARTUP = ("Initializing a V0 LLM engine", "Initializing a V1 LLM engine", "Initializing an LLM engine",
                "vLLM API server version", "Load weight begin", "server_args=ServerArgs(")


# Cheap substring tests decide whether a line can matter at all (most lines are requests and stats). Every
# pattern, phase marker and start-up marker above contains one of these (tests/test_sizing.py checks it).
_GATE_KEYS = ("GiB", "GB", "MiB", "KiB", "blocks", "emory", "KV", "onfig", "args", "Args", "version", "LLM engine",
              "rofil", "apture", "oad", "startup", "Started", "Uvicorn", "fired up", "throughput", "batch",
              "max_total_num_tokens", "graph", "initialize", "init_", "_dummy_run", "estimated maximum",
              "concurrency", "cache", "Cache", "Starting")


_GATE_RX = re.compile("|".join(re.escape(k) for k in _GATE_KEYS))  # 2x faster than any(k in line ...)


def may_be_startup_line(line: str) -> bool:
    return _GATE_RX.search(line) is not None
