"""``fragscope kv-budget`` (placeholder; filled in by the core issue)."""
from __future__ import annotations

import click


@click.command("kv-budget")
def kv_budget_cmd() -> None:
    """KV-cache budget calculator."""
