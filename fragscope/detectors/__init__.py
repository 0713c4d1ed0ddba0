"""Detectors: pure functions from a Window to findings. Entry point: :func:`diagnose`."""
from __future__ import annotations

from ..model import Report, Window


def diagnose(window: Window) -> Report:
    """Run every detector over ``window`` and return a ranked report (filled in by the core issue)."""
    from .engine import run_detectors  # noqa: PLC0415

    return run_detectors(window)
