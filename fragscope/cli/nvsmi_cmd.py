"""``diagnose nvidia-smi FILE``: nvidia-smi's default table read (memory used / total per GPU, the processes it
lists). docs/collectors.md#nvidia-smi-table."""
from __future__ import annotations

import json
import sys

import click

from .common import EXIT_OK, fail


@click.command("nvidia-smi")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["human", "json"]), default="human", show_default=True)
@click.option("--fail-on", type=click.Choice(["info", "warning", "critical", "never"]), default="critical",
              show_default=True, help="Accepted for symmetry with diagnose FILE; a table alone gives no finding.")
def nvsmi_cmd(file: str, fmt: str, fail_on: str) -> int:
    """Read nvidia-smi's table: memory used / total per GPU and per listed process (one snapshot: no trend)."""
    from ..collectors.inputs import check_regular
    from ..collectors.nvsmi_table import judge_table, looks_like_table, parse_nvsmi_table

    try:
        check_regular(file)
        with open(file, encoding="utf-8", errors="replace") as fh:
            text = fh.read(4 << 20)
    except FileNotFoundError:
        fail(f"{file}: no such file")
    except (OSError, ValueError) as e:
        fail(f"{file}: cannot read: {e}")
    if not looks_like_table(text):
        fail(f"{file}: not nvidia-smi's table (no 'NVIDIA-SMI' banner or 'Processes:' section)")
    try:
        t = parse_nvsmi_table(text)
    except ValueError as e:
        fail(f"{file}: {e}")
    lines = judge_table(t)
    why = ("one nvidia-smi snapshot: whole-device memory and the processes it can see, no allocator state and no "
           "trend; the diagnoses need the engine's metrics or a recording (fragscope agent, diagnose --vllm URL)")
    if fmt == "json":
        doc = {"source": file, "nvidia_smi": t, "summary": lines, "findings": [],
               "inconclusive": [{"id": "nvidia-smi", "missing": ["engine metrics or a recording"], "reason": why}]}
        sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    else:
        head = "nvidia-smi table" + (f" (driver {t['driver_version']})" if t["driver_version"] else "")
        click.echo(f"{head}: {len(t['gpus'])} GPU row(s), {len(t['processes'])} process(es) listed")
        for ln in lines:
            click.echo(f"  {ln}")
        click.echo(f"Could not judge (not healthy, just not enough data): {why}")
    return EXIT_OK


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    diagnose_group.add_command(nvsmi_cmd)
