"""The ``e2e`` marker: long fuzzing runs, skipped unless selected (``-m e2e``) or FRAGSCOPE_E2E=1."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import harness`


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: long end-to-end runs (fuzzing campaigns); run with -m e2e")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("FRAGSCOPE_E2E") == "1" or "e2e" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="long run: select with -m e2e or FRAGSCOPE_E2E=1")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)
