"""The diagnoses judged on a metrics window (recordings, live servers, the agent, the fleet), registered one
line each: a module of ``fragscope.detectors`` declares everything else (its detector and level rule, Config,
signals, playbook and computed actions, suppressions, capture and alert rule; ``Diagnosis.from_module``).

The order is the run order, the order findings of equal rank are listed in. The GPU-memory diagnoses come
first, then those beyond it (a CPU-starved engine, a stalled engine, a straggling rank, a faulty GPU, a host out
of memory), whose detectors judge the present themselves and so run on windows of any length.
"""
from __future__ import annotations

from importlib import import_module

from .registry import Diagnosis, Source

MODULES = (  # fragscope/detectors/<name>.py (or a package <name>/)
    "fragmentation",
    "kv_pressure",
    "memory_leak",
    "throttling",
    "launch_bound",
    "saturation",
    "block_size",
    "kv_pool",
    "cpu_starved",
    "stalled",
    "straggler",
    "gpu_fault",
    "host_memory",
)



def _declared(name: str):
    return lambda: [Diagnosis.from_module(import_module(f"..detectors.{name}", __package__))]


# One source per module: a lookup by id imports the one module that declares it (registry.Registry).
SOURCES = tuple(Source(name, _declared(name), window=True) for name in MODULES)

__all__ = ["MODULES", "SOURCES"]
