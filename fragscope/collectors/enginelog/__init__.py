"""Engine log reading (vLLM V0/V1, SGLang, PyTorch OOM messages), one job per module. docs/logs.md.

``events`` (the LogEvent record and number parsing), ``prefixes`` (line prefixes and timestamps),
``patterns`` (the table of message patterns), ``parser`` (LogParser: lines -> events), ``state``
(LogState: events -> counters), ``reader`` (a log file read safely: caps, gzip, non-regular files).
The ``tail -F`` follower is :mod:`fragscope.collectors.tail`; the agent collector is
:mod:`fragscope.collectors.logs`.
"""
from __future__ import annotations

import importlib

# Each name and the module of this package that holds it, imported on first use: reading metrics needs
# ``jobkind`` and ``oomproc`` alone (the sizing arithmetic), not the message patterns compiled at import.
_FROM = {"GIB": ".events", "KIB": ".events", "KINDS": ".events", "MIB": ".events", "LogEvent": ".events",
         "parse_size": ".events", "LogParser": ".parser", "parse_log": ".parser", "parse_log_line": ".parser",
         "LogInputError": ".reader", "iter_file_lines": ".reader", "read_log_file": ".reader",
         "LogState": ".state"}

__all__ = sorted(_FROM)


def __getattr__(name: str):
    where = _FROM.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value
