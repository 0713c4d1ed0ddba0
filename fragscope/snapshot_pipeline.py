"""Memory-snapshot pipeline: read a snapshot file (collectors) -> analyse (detectors) -> playbooks.

The one place that joins file reading to the pure snapshot analysis; used by the agent's capture
feature and by scripts (``diagnose snapshot`` reads with the same functions, with its --max-bytes).
Contract: docs/snapshot.md.
"""
from __future__ import annotations

from .collectors.snapshot import MAX_SNAPSHOT_BYTES, read_snapshot
from .model import Finding
from .playbooks.snapshot import diagnose_snapshot


def diagnose_snapshot_file(path: str, max_bytes: int = MAX_SNAPSHOT_BYTES, **kw) -> tuple[dict, list[Finding]]:
    """Read, analyse and attach playbooks: (the document of docs/snapshot.md, findings ranked).

    Raises :class:`~fragscope.collectors.snapshot.SnapshotError` (one line) on bad input. Keyword
    arguments go to :func:`fragscope.detectors.snapshot.analyse_snapshot` (cfg, device, device_total_bytes).
    """
    return diagnose_snapshot(read_snapshot(path, max_bytes=max_bytes), **kw)


__all__ = ["diagnose_snapshot_file"]
