"""The engine's own start-up memory accounting, read from its log (vLLM V0 / V1, SGLang). docs/sizing.md.

Pure: lines in, a :class:`StartupAccounting` out; no I/O. Figures are kept exactly as logged, in bytes
(vLLM and SGLang print "GB" but divide by 2**30, so every unit is binary: see
:func:`fragscope.collectors.enginelog.parse_size`). PyTorch OOM messages are parsed by the log collector's
parser (one source for that text). Every field is ``None`` when the log did not say it: absent is not 0.

A log can hold several start-ups (restarts, or one line per tensor-parallel worker): the accounting of
the *last* start-up wins; tensor-parallel workers print the same figures, and the last one is kept.
"""
from __future__ import annotations

from datetime import timezone
from typing import Iterable

from ..collectors.enginelog import parse_log_line
from ..collectors.enginelog.prefixes import Clock, split_line
from ..collectors.enginelog.rejoin import unwrap_lines
from ..collectors.enginelog.patterns import async_oom_complete, fill_async_oom
from .accounting import StartupAccounting
from .wordings import (ANSI, AVAIL_KV, BLOCKS, CFG, ENGINE_V, GRAPH, GRAPH_EST, GRAPH_POOL,
                       GRAPH_PROFILING_OFF, GRAPH_PROFILING_ON, KV_INSUFF, KV_INSUFF_EST, KV_INSUFF_OLD,
                       KV_TOKENS, MAX_CONC, NEW_STARTUP, NO_CACHE, PHASES, READY, SG_AVAIL, SG_FIELDS,
                       SG_GRAPH_BEGIN, SG_GRAPH_END, SG_KV, SG_LOAD_BEGIN, SG_LOAD_END, SG_MAX_TOTAL, SG_POOL_END,
                       SHORTFALL, SUMMARY_DESIRED, SUMMARY_FIT, SUMMARY_FREE, SUMMARY_FULL, SUMMARY_INUSE,
                       SUMMARY_PARTS, V0_KV, V0_KV_GMU, V0_PROSE, V0_PROSE_BUDGET, V0_TABLE, V0_TABLE_GMU,
                       VERSION, WEIGHTS, may_be_startup_line, gib_with_commas, int_with_commas, size_of_match, signed_size_of_match)


class StartupParser:
    """Feed lines one by one (or use :func:`parse_startup`)."""

    def __init__(self) -> None:
        self.acc = StartupAccounting()
        self.line_no = 0
        self._async: dict | None = None
        self._async_n = 0
        self._last_raw: str | None = None
        self.phase: str | None = None
        self._in_profile_table = False
        self._sg_loads: list[float] = []
        self._sg_base: float | None = None
        self._sg_after_begin = False

    def _set(self, name: str, value) -> None:
        setattr(self.acc, name, value)
        self.acc.lines[name] = self.line_no

    def _new_startup(self) -> None:
        if self.acc.has_accounting or self.acc.started:  # the previous start-up is complete: begin anew
            self.acc = StartupAccounting(startups=max(1, self.acc.startups) + 1)
            self.phase = None
            self._sg_loads = []
            self._sg_base = None
            self._sg_after_begin = False
        elif self.acc.startups == 0:
            self.acc.startups = 1

    def result(self) -> StartupAccounting:
        """The accounting so far, completed (derived fields); the parser can go on reading (a followed log)."""
        import copy

        q = copy.copy(self)
        q.acc = copy.deepcopy(self.acc)
        return _finish(q)

    def feed(self, raw: str) -> None:
        """One log line. A line whose figures are not numbers (a 400-digit figure, ``1.2.3``, also inside a
        logged prompt, which any client of the engine can write) is skipped and counted, never fatal."""
        try:
            self._feed(raw)
        except (ValueError, OverflowError, ArithmeticError):  # BadNumber and the conversions after it
            self.bad_lines += 1

    bad_lines = 0  # lines skipped: a figure that is not a number

    def _feed(self, raw: str) -> None:
        self.line_no += 1
        if self._async is not None:  # a cudaMallocAsync OOM: its figures come on the lines after its header
            if self._async_n < 8 and fill_async_oom(self._async, raw):
                self._async_n += 1
                if async_oom_complete(self._async):
                    self._async.pop("_limit_label", None)
                    self._async = None
                return
            self._async.pop("_limit_label", None)
            self._async = None
        if not may_be_startup_line(raw) or raw == self._last_raw:
            # the same line again (a progress bar redrawn, a worker's identical echo) sets what it set
            return
        self._last_raw = raw
        if ("is preempted " in raw or (self.acc.served and ("Avg prompt throughput" in raw or "batch" in raw))) \
                and "out of memory" not in raw:
            return  # stats lines after start-up: the run-time summary reads them, not this parser
        line = ANSI.sub("", raw).rstrip("\r\n") if "\x1b" in raw else raw.rstrip("\r\n")
        if not line.strip():
            return
        a = self.acc
        if any(m in line for m in NEW_STARTUP):
            if not ("Load weight begin" in line and self.phase == "load"):
                self._new_startup()
                a = self.acc
        m = ENGINE_V.search(line)
        if m:
            a.engine = "vllm-" + m.group(1).lower()
        m = VERSION.search(line)
        if m:
            a.version = next(g for g in m.groups() if g)
            a.engine = a.engine or "vllm"
        for name, sub in PHASES:
            if any(s in line for s in sub):
                self.phase = name
                break
        if any(s in line for s in READY):
            if a.pool_tokens or a.kv_cache_bytes is not None:
                a.started = True
                if any(s in line for s in ("Avg prompt throughput", "Decode batch", "Prefill batch")):
                    a.served = True
                self.phase = "runtime"
        self._config(line)
        self._vllm(line)
        self._sglang(line)
        self._failures(line)

    # --- pieces --------------------------------------------------------------------------------
    def _config(self, line: str) -> None:
        if not ("Namespace(" in line or "args" in line or "config" in line or "ServerArgs(" in line):
            return
        for name, (rx, conv) in CFG.items():
            m = rx.search(line)
            if m:
                target = "kv_cache_memory_bytes_setting" if name == "kv_cache_memory_bytes" else name
                if target == "block_size" and "ServerArgs(" in line:
                    continue
                self._set(target, conv(m.group(1)))
        if "ServerArgs(" in line or "server_args=" in line:
            self.acc.engine = "sglang"

    def _vllm(self, line: str) -> None:
        a = self.acc
        if "Memory profiling results" in line:
            self._in_profile_table = True
            a.engine = a.engine or "vllm-v0"
        m = V0_PROSE_BUDGET.search(line)
        if m:
            self._set("total_gpu_memory_bytes", size_of_match(m, 1))
            self._set("gpu_memory_utilization", float(m.group(3)))
            self._set("requested_memory_bytes", size_of_match(m, 4))
            a.engine = a.engine or "vllm"
        for rx_table in (V0_PROSE, V0_KV):
            for name, rx in rx_table.items():
                m = rx.search(line)
                if m:
                    self._set(name, signed_size_of_match(m))
        if "kv_cache_size=" in line:
            m = V0_KV_GMU.search(line)
            if m:
                self._set("gpu_memory_utilization", float(m.group(1)))
        if self._in_profile_table:
            hit = False
            for name, rx in V0_TABLE.items():
                m = rx.search(line)
                if m:
                    self._set(name, size_of_match(m))
                    hit = True
            m = V0_TABLE_GMU.search(line)
            if m:
                self._set("gpu_memory_utilization", float(m.group(1)))
                hit = True
            if not hit and "Memory profiling results" not in line and "duration" not in line:
                self._in_profile_table = False
        m = WEIGHTS.search(line)
        if m:
            self._set("weights_bytes", size_of_match(m))
            a.engine = a.engine or "vllm"
        m = BLOCKS.search(line)
        if m:
            self._set("gpu_blocks", int_with_commas(m.group(2)))
            if m.group(3) is not None:
                self._set("cpu_blocks", int_with_commas(m.group(3)))
            a.engine = a.engine or "vllm"
        m = KV_TOKENS.search(line)
        if m:
            self._set("kv_cache_tokens", int_with_commas(m.group(2)))
            a.engine = a.engine or "vllm-v1"
        m = MAX_CONC.search(line)
        if m:
            self._set("max_concurrency_tokens_per_request", int_with_commas(m.group(1)))
            self._set("max_concurrency", float(m.group(2).replace(",", "")))
        m = AVAIL_KV.search(line)
        if m:
            self._set("kv_cache_bytes", signed_size_of_match(m))
            a.engine = a.engine or "vllm-v1"
        m = GRAPH.search(line)
        if m:
            self._set("cuda_graph_seconds", float(m.group(1)))
            if m.group(2) is not None:
                self._set("cuda_graph_bytes", size_of_match(m, 2))
        m = GRAPH_EST.search(line)
        if m:
            self._set("cuda_graph_estimate_bytes", size_of_match(m))
            if a.cuda_graph_in_budget is None:
                self._set("cuda_graph_in_budget", True)
        m = GRAPH_POOL.search(line)
        if m:
            self._set("cuda_graph_bytes", size_of_match(m, 1))
            self._set("cuda_graph_estimate_bytes", size_of_match(m, 3))
        if GRAPH_PROFILING_ON.search(line):
            self._set("cuda_graph_in_budget", True)
            self._set("gpu_memory_utilization", float(GRAPH_PROFILING_ON.search(line).group(1)))
        elif GRAPH_PROFILING_OFF in line:
            self._set("cuda_graph_in_budget", False)
        m = SUMMARY_FREE.search(line)
        if m:
            self._set("startup_free_bytes", gib_with_commas(m.group(1)))
            self._set("total_gpu_memory_bytes", gib_with_commas(m.group(2)))
            d = SUMMARY_DESIRED.search(line)
            if d:
                self._set("gpu_memory_utilization", float(d.group(1)))
                self._set("requested_memory_bytes", gib_with_commas(d.group(2)))
            for name, rx in SUMMARY_PARTS.items():
                p = rx.search(line)
                if p:
                    self._set(name, gib_with_commas(p.group(1)))
            for name, rx in (("kv_cache_memory_bytes_fit", SUMMARY_FIT), ("kv_cache_memory_bytes_full", SUMMARY_FULL)):
                p = rx.search(line)
                if p:
                    self._set(name, int(p.group(1)))
            p = SUMMARY_INUSE.search(line)
            if p:
                self._set("kv_cache_bytes", gib_with_commas(p.group(1)))
            a.engine = "vllm-v1"

    def _sglang(self, line: str) -> None:
        a = self.acc
        m = SG_LOAD_BEGIN.search(line)
        if m:
            if a.sglang_free_at_init_bytes is None:  # a draft model (MTP / EAGLE) loads second: keep the first
                self._set("sglang_free_at_init_bytes", size_of_match(m))
            if self._sg_loads and not self._sg_after_begin:
                # a begin after an end: another model (draft) loads; its ends add to what is loaded so far
                self._sg_base = a.weights_bytes
            self._sg_after_begin = True
            a.engine = "sglang"
        m = SG_LOAD_END.search(line)
        if m:
            self._set("sglang_free_after_weights_bytes", size_of_match(m, 1))
            # a draft model's "mem usage" adds to the target's (it can be negative: shared embeddings freed);
            # tensor-parallel workers print their own end lines after all begins: those replace, not add
            usage = size_of_match(m, 3)
            if self._sg_base is not None:
                usage += self._sg_base
            self._sg_after_begin = False
            self._sg_loads.append(size_of_match(m, 3))
            self._set("weights_bytes", usage)
            a.engine = "sglang"
        m = SG_KV.search(line)
        if m:
            self._set("kv_cache_tokens", int_with_commas(m.group(1)))
            self._set("kv_cache_bytes", size_of_match(m, 2) + size_of_match(m, 4))
            a.engine = "sglang"
        m = SG_POOL_END.search(line)
        if m:
            self._set("sglang_free_after_pool_bytes", size_of_match(m))
        m = SG_GRAPH_BEGIN.search(line)
        if m:
            self._set("sglang_free_at_graph_begin_bytes", size_of_match(m))
        m = SG_GRAPH_END.search(line)
        if m:
            self._set("cuda_graph_seconds", float(m.group(1)))
            if m.group(2) is not None:
                self._set("cuda_graph_bytes", size_of_match(m, 2))
            if m.group(4) is not None:
                self._set("sglang_free_after_graphs_bytes", size_of_match(m, 4))
        m = SG_MAX_TOTAL.search(line)
        if m:
            self._set("max_total_num_tokens", int(m.group(1)))
            for name, rx in SG_FIELDS.items():
                g = rx.search(line)
                if g:
                    self._set(name, int(g.group(1)))
            g = SG_AVAIL.search(line)
            if g:
                self._set("sglang_free_after_graphs_bytes", size_of_match(g))
            a.engine = "sglang"
            a.started = True  # SGLang prints this once the scheduler is up

    def _failures(self, line: str) -> None:
        a = self.acc
        if a.failure is not None and not a.started:
            # one failure per start-up: the first is the cause, the rest is its traceback. An OOM's
            # figures may still come on the next line of the same message.
            if a.failure["kind"] == "oom" and "figures" not in a.failure and "out of memory" in line:
                self._oom(line, into=a.failure)
            if self.phase in ("graph-capture", "profile", "kv-allocation", "load") and a.failure.get("phase") is None:
                a.failure["phase"] = self.phase
            return
        m = SHORTFALL.search(line)
        if m:
            a.failure = {"kind": "startup-shortfall", "phase": "init", "line": self.line_no,
                         "free_bytes": gib_with_commas(m.group(1)), "total_bytes": gib_with_commas(m.group(2)),
                         "gpu_memory_utilization": float(m.group(3)), "requested_bytes": gib_with_commas(m.group(4))}
            self._set("total_gpu_memory_bytes", gib_with_commas(m.group(2)))
            self._set("gpu_memory_utilization", float(m.group(3)))
            self._set("requested_memory_bytes", gib_with_commas(m.group(4)))
            self._set("startup_free_bytes", gib_with_commas(m.group(1)))
            a.engine = a.engine or "vllm"  # vLLM's own wordings (gpu_worker.py, kv_cache_utils.py)
            return
        if NO_CACHE.search(line):
            a.failure = {"kind": "no-kv-memory", "phase": "kv-allocation", "line": self.line_no}
            return
        m = KV_INSUFF_OLD.search(line)
        if m:
            a.failure = {"kind": "kv-insufficient", "phase": "kv-allocation", "line": self.line_no,
                         "max_model_len": int(m.group(1)), "available_tokens": int(m.group(2))}
            a.engine = a.engine or "vllm"
            return
        m = KV_INSUFF.search(line)
        if m:
            f = {"kind": "kv-insufficient", "phase": "kv-allocation", "line": self.line_no,
                 "max_model_len": int_with_commas(m.group(1)), "needed_bytes": gib_with_commas(m.group(2)),
                 "available_bytes": gib_with_commas(m.group(3))}
            e = KV_INSUFF_EST.search(line)
            if e:
                f["estimated_max_model_len"] = int_with_commas(e.group(1))
            a.failure = f
            a.engine = a.engine or "vllm"
            return
        if "out of memory" in line:
            ev = self._oom(line, into=None)
            if ev is None:
                return
            if a.started:
                ev["phase"] = "runtime"
                if not any(o.get("figures") == ev.get("figures") and o.get("figures") for o in a.runtime_ooms):
                    a.runtime_ooms.append(ev)
            else:
                ev["phase"] = self.phase if self.phase != "runtime" else None
                a.failure = ev

    def _oom(self, line: str, into: dict | None) -> dict | None:
        ev = parse_log_line(line)
        if ev is None or ev.kind != "oom":
            return None
        f = dict(ev.fields)
        out = into if into is not None else {"kind": "oom", "line": self.line_no}
        if f.get("wording") == "cuda-error":
            out.setdefault("wording", "cuda-error")
            return out
        out["figures"] = True
        for k in ("requested_bytes", "total_bytes", "free_bytes", "process_in_use_bytes", "allocated_bytes",
                  "reserved_unallocated_bytes", "reserved_bytes", "other_processes", "wording", "gpu",
                  "memory_limit_bytes", "_limit_label"):
            if k in f:
                out[k] = f[k]
        if not async_oom_complete(out):
            self._async, self._async_n = out, 0
        return out


def parse_startup(lines: Iterable[str]) -> StartupAccounting:
    """The start-up accounting of the last start-up in ``lines`` (an open file works)."""
    p = StartupParser()
    for line in unwrap_lines(lines, _has_prefix):
        p.feed(line)
    return p.result()


_PREFIX_CLOCK = Clock(0.0, timezone.utc)


def _has_prefix(line: str) -> bool:
    """The line opens a record of its own (a timestamp, an engine header, a process tag): not a continuation."""
    r = split_line(line, _PREFIX_CLOCK, None)[0]
    return r.ts is not None or r.engine_line or r.pid is not None


def _finish(p: StartupParser) -> StartupAccounting:
    acc = p.acc
    if acc.activation_peak_bytes is None and acc.peak_torch_memory_bytes is not None and acc.weights_bytes is not None:
        # older V0 prints the torch peak including the weights: the activation part is the difference
        acc.activation_peak_bytes = max(0.0, acc.peak_torch_memory_bytes - acc.weights_bytes)
        acc.lines["activation_peak_bytes"] = -1
    if acc.startups == 0 and acc.has_accounting:
        acc.startups = 1  # a log that begins after the start-up banner
    if acc.block_size is None and acc.engine == "sglang" and acc.page_size:
        acc.block_size = acc.page_size
    if acc.block_size is None and acc.gpu_blocks and acc.max_concurrency and acc.max_concurrency_tokens_per_request:
        # concurrency = blocks x B / tokens_per_request (printed to 2 decimals): solve for B and accept it
        # only when it lands within 2 % of a block size vLLM accepts (1.54 x 40000 / 3852 = 15.99 -> 16)
        est = acc.max_concurrency * acc.max_concurrency_tokens_per_request / acc.gpu_blocks
        for b in (1, 8, 16, 32, 64, 128, 256):
            if abs(est - b) <= 0.02 * b:
                acc.block_size = b
                acc.lines["block_size"] = -1  # derived, not logged
                break
    if acc.started is False and acc.failure is None and acc.pool_tokens and acc.startups <= 1:
        # the log ends after sizing the pool: it started as far as this log shows
        acc.started = p.phase == "runtime"
    return acc
