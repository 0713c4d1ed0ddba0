"""Playbooks: one per diagnosis (text + actions computed from the evidence)."""
from __future__ import annotations

PLAYBOOKS: dict = {}


def render_playbook_text(pb) -> str:
    return str(pb)
