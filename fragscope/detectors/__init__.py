"""Detectors: pure functions from a Window (through a Frame) to findings.

Callers use :func:`diagnose`; it is re-exported from :mod:`fragscope.playbooks`, which attaches
the playbooks (playbooks sit above detectors in the layering, so the import is lazy).
"""
from __future__ import annotations

from ..model import Report, Window


def diagnose(window: Window) -> Report:
    """Run every detector over ``window``; findings carry their full playbook."""
    from ..playbooks import diagnose as _diagnose  # noqa: PLC0415  (upper layer, imported lazily)

    return _diagnose(window)
