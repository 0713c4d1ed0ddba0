"""Engine log reading (vLLM V0/V1, SGLang, PyTorch OOM messages), one job per module. docs/logs.md.

``events`` (the LogEvent record and number parsing), ``prefixes`` (line prefixes and timestamps),
``patterns`` (the table of message patterns), ``parser`` (LogParser: lines -> events), ``state``
(LogState: events -> counters), ``reader`` (a log file read safely: caps, gzip, non-regular files).
The ``tail -F`` follower is :mod:`fragscope.collectors.tail`; the agent collector is
:mod:`fragscope.collectors.logs`.
"""
from __future__ import annotations

from .events import GIB, KIB, KINDS, MIB, LogEvent, parse_size
from .parser import LogParser, parse_log, parse_log_line
from .reader import LogInputError, iter_file_lines, read_log_file
from .state import LogState

__all__ = ["GIB", "KIB", "KINDS", "MIB", "LogEvent", "LogInputError", "LogParser", "LogState", "iter_file_lines",
           "parse_log", "parse_log_line", "parse_size", "read_log_file"]
