"""Detectors: pure functions from a Window (through a Frame) to findings.

``engine.run_detectors(window)`` runs them all. Callers use :func:`fragscope.playbooks.diagnose`,
which also attaches each finding's playbook (playbooks sit above detectors in the layering).
"""
