"""CLI commands (module owned by one area; see fragscope/cli/__init__.py)."""
from __future__ import annotations

import click


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    """Attach this module's commands to the two entry points."""
