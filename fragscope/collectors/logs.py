"""Engine log files for the agent: the ``logs`` collector (``fragscope_log_*`` samples). docs/logs.md.

The parts, one job each: :mod:`fragscope.collectors.enginelog` turns text lines into
:class:`LogEvent` records (prefix stripping, the table of message patterns, the state fold) and reads
files safely; :mod:`fragscope.collectors.tail` follows a file like ``tail -F``. This module joins
them: each tick, the new lines become events, the events fold into :class:`LogState`, the state
becomes samples. The names below stay importable from here (``from fragscope.collectors.logs import
parse_log``).
"""
from __future__ import annotations

import logging
import os
from datetime import tzinfo
from typing import Mapping

from ..model import CollectResult, Missing, Reason, Sample, make_labels
from .enginelog import (GIB, KIB, KINDS, MIB, LogEvent, LogInputError, LogParser, LogState, iter_file_lines,
                        parse_log, parse_log_line, parse_size, read_log_file)
from .safefile import printable
from .tail import FileTail, NotRegularFile

log = logging.getLogger(__name__)

__all__ = ["GIB", "KIB", "KINDS", "MIB", "LogCollector", "LogEvent", "LogInputError", "LogParser", "LogState",
           "SIGNAL_NAMES", "iter_file_lines", "parse_log", "parse_log_line", "parse_size", "read_log_file"]


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
M_KV_BYTES = "fragscope_log_kv_cache_bytes"  # the KV pool's size from the last start-up (sizing, docs/sizing.md)
M_SKIPPED = "fragscope_log_lines_skipped_total"  # lines the parsers failed on, skipped (not a signal)
SIGNAL_NAMES = (M_PREEMPTIONS, M_KV_CAPACITY, M_KV_BLOCKS, M_OOMS, M_OOM_UNALLOC, M_RUNNING, M_WAITING,
                M_KV_USAGE, M_GEN_TPS, M_KV_BYTES)


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
        self.tail = FileTail(self.path, from_start=from_start, max_bytes_per_tick=self.max_bytes,
                             max_line_bytes=self.max_line)
        self._down_logged = False
        self.events_read = 0
        self.bytes_read = 0
        self.bad_lines = 0  # lines whose parsing failed, skipped (fragscope_log_lines_skipped_total)
        self.dropped = {"log_lines": 0}  # the same count, exported by the agent with the other limits
        from ..sizing.startup import StartupParser  # the start-up accounting (sizing reads this module's patterns)

        self.startup = StartupParser()

    def accounting(self):
        """The last start-up's memory accounting read so far (sizing.StartupAccounting), for
        ``sizing.judge_accounting``: startup-oom and kv-pool-undersized with the log's own figures."""
        return self.startup.result()

    def read_new_lines(self) -> list[str]:
        """Lines appended since the last call (:meth:`FileTail.read_new_lines`). Raises OSError."""
        return self.tail.read_new_lines()

    # -- collector ----------------------------------------------------------------------------
    def collect(self, now: float) -> CollectResult:
        try:
            return self._collect(now)
        except Exception as e:  # never raise into the agent; the tail keeps its offset (the lines it
            # handed over are read: reopening would read them again, and fail again, for good)
            return self._down(now, Reason.PARSE_ERROR, f"{printable(self.path)}: {type(e).__name__}: "
                                                       f"{printable(str(e), 200)}")

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
            self.tail.close()
            return self._down(now, Reason.NO_PERMISSION, f"log file {self.path}: permission denied")
        except IsADirectoryError:
            return self._down(now, Reason.SOURCE_DOWN, f"log file {self.path} is a directory")
        except NotRegularFile:
            return self._down(now, Reason.SOURCE_DOWN, f"log file {self.path} is not a regular file (FIFO, device, "
                                                       "socket): give the file the engine writes")
        if self._down_logged:
            log.info("logs collector: %s readable again", self.path)
            self._down_logged = False
        self.bytes_read += sum(len(x) + 1 for x in lines)
        st = self.state
        new_oom = False
        stats_engines: set[str] = set()
        for line in lines:
            try:
                self.startup.feed(line)
                for ev in self.parser.feed(line):
                    self.events_read += 1
                    st.apply(ev)
                    if ev.kind == "oom":
                        new_oom = True
                    elif ev.kind == "stats":
                        stats_engines.add(ev.engine)
            except Exception as e:  # noqa: BLE001 - one bad line (a 400-digit figure in a logged prompt) is
                self.bad_lines += 1  # skipped, counted, logged once; never the collector
                if self.bad_lines == 1 or self.bad_lines in (10, 100, 1000, 10000):
                    log.warning("logs collector: %s: line skipped (%s: %s): %r; %d skipped so far",
                                printable(self.path), type(e).__name__, printable(str(e), 120), line[:120],
                                self.bad_lines)
        return CollectResult(samples=self._samples(now, new_oom, stats_engines), missing=self._missing(now))

    def _lab(self, **extra: str) -> tuple:
        return make_labels(dict(self.labels) | {k: v for k, v in extra.items() if v})

    def _samples(self, now: float, new_oom: bool, stats_engines: set[str]) -> list[Sample]:
        st = self.state
        out = [Sample(M_OOMS, self.labels, now, float(st.ooms_total - self.parser.duplicate_ooms))]
        skipped = self.bad_lines + self.startup.bad_lines  # the start-up parser skips its own bad lines
        self.dropped["log_lines"] = skipped
        if skipped:
            out.append(Sample(M_SKIPPED, self.labels, now, float(skipped)))
        if st.preemptions_total is not None:
            out.append(Sample(M_PREEMPTIONS, self.labels, now, st.preemptions_total))
        if st.capacity_tokens is not None:
            out.append(Sample(M_KV_CAPACITY, self.labels, now, st.capacity_tokens))
        if st.capacity_blocks is not None:
            out.append(Sample(M_KV_BLOCKS, self.labels, now, st.capacity_blocks))
        kvb = self.startup.acc.kv_cache_bytes
        if kvb is not None and kvb > 0 and self.startup.acc.failure is None:
            out.append(Sample(M_KV_BYTES, self.labels, now, float(kvb)))
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
        self.tail.close()


