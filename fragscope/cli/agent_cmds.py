"""CLI commands (module owned by one area; see fragscope/cli/__init__.py)."""
from __future__ import annotations

import click


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    """Attach this module's commands to the two entry points."""


def live_options(f):
    """Options of ``diagnose`` for live sources (--agent, --vllm, --dcgm, --duration)."""
    return f


def run_live(ctx: click.Context, **opts) -> "object | None":
    """Return a Window sampled from a live source, or None when no live option was given."""
    return None
