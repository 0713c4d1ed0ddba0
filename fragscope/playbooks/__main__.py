"""``python -m fragscope.playbooks``: the threshold table of docs/diagnoses.md, from the window diagnoses' Configs."""
from __future__ import annotations

from . import REGISTRY
from .registry import thresholds_markdown

print(thresholds_markdown(REGISTRY))
