"""Shared helpers for the engine-log tests: the CLI run in-process, one-line-error checks."""
from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

DATA = Path(__file__).parent / "data" / "logs"


def utc(*a) -> float:
    return datetime(*a, tzinfo=timezone.utc).timestamp()


def run_diagnose(capsys, monkeypatch, *args) -> tuple[int, str, str]:
    """`diagnose ARGS` in this process (the real entry point, its error handling included)."""
    from fragscope.cli import run_and_exit, diagnose_group

    monkeypatch.setattr(sys, "argv", ["diagnose", *args])
    try:
        run_and_exit(diagnose_group, "diagnose")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    out, err = capsys.readouterr()
    return code, out, err


def strict_json(text: str):
    """json.loads that refuses NaN / Infinity tokens (the contract: JSON always valid)."""
    def bad(tok):
        raise ValueError(f"non-JSON number {tok}")
    return json.loads(text, parse_constant=bad)
