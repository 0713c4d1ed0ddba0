"""Collectors and readers: everything that turns an outside source (NVML, the in-process probe, engine
/metrics, DCGM, Prometheus, recordings, logs, traces, memory snapshots) into fragscope's data model."""
