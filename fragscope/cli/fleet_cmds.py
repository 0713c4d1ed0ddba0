"""CLI commands (module owned by one area; see fragscope/cli/__init__.py)."""
from __future__ import annotations

import click


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    """Attach this module's commands to the two entry points."""


def fleet_options(f):
    """Options of ``diagnose`` for Prometheus fleet mode (--prometheus, --since, --selector, ...)."""
    return f


def run_fleet(ctx: click.Context, fmt: str, fail_on: str, **opts) -> "int | None":
    """Run a fleet diagnosis and return the exit code, or None when --prometheus was not given."""
    return None
