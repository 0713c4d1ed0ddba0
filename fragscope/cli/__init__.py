"""Command line: ``diagnose`` (on-call) and ``fragscope`` (agent, record, kv-budget, capture...).

Each area owns one module that registers its commands here; modules are a few lines of library
calls each. Only this package imports click.
"""
from __future__ import annotations

import os
import sys

# Before anything imports numpy: fragscope's numpy work is element-wise (no large BLAS calls), and
# OpenBLAS's idle worker threads spin after each call. One thread: 0.10-0.18 s less CPU per
# `diagnose trace` of a 2 M-kernel export on the 2-core VM (interleaved runs); the agent does not
# keep spinning threads beside its collectors. A value the user set wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import click

from .. import __version__
from . import (agent_cmds, diagnose_cmd, engines_cmd, fleet_cmds, kv_budget_cmd, logs_cmd, sizing_cmd, snapshot_cmd,
               trace_cmd)
from .common import EXIT_USAGE


class DefaultGroup(click.Group):
    """A group whose unknown first argument falls through to a default command.

    ``diagnose FILE`` and ``diagnose --vllm URL`` run the default command; ``diagnose snapshot FILE``,
    ``diagnose trace FILE``, ``diagnose logs FILE`` and ``diagnose explain ID`` are subcommands.
    """

    default_cmd = "run"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = [self.default_cmd, *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx, formatter):
        formatter.write_usage(ctx.command_path, "[FILE | URL | --agent URL | --vllm URL | --prometheus URL] [OPTIONS]\n"
                              "       diagnose snapshot|trace|logs FILE | explain ID")


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]},
             help="Find out why a GPU model server got slow or ran out of memory.")
@click.version_option(__version__, prog_name="diagnose")
def diagnose_group() -> None:
    pass


@click.group(context_settings={"help_option_names": ["-h", "--help"]},
             help="fragscope: diagnostics agent for GPU model serving.")
@click.version_option(__version__, prog_name="fragscope")
def fragscope_group() -> None:
    pass


for _mod in (diagnose_cmd, kv_budget_cmd, snapshot_cmd, trace_cmd, logs_cmd, agent_cmds, fleet_cmds, sizing_cmd,
             engines_cmd):
    _mod.register(fragscope_group, diagnose_group)
# `fragscope diagnose ...` is the same as `diagnose ...`
fragscope_group.add_command(diagnose_group, name="diagnose")


def _run(group: click.Group, prog: str) -> None:
    try:
        rc = group.main(prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.UsageError as e:
        # one line, like every other input error (click's default prints a usage block)
        path = e.ctx.command_path if e.ctx is not None else prog
        if path.endswith(f" {DefaultGroup.default_cmd}"):
            path = path[: -len(DefaultGroup.default_cmd) - 1]
        click.echo(f"{prog}: error: {e.format_message()} (see '{path} --help')", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code if e.exit_code else EXIT_USAGE)
    except click.exceptions.Abort:
        click.echo(f"{prog}: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(rc if isinstance(rc, int) else 0)


def diagnose_main() -> None:
    _run(diagnose_group, "diagnose")


def main() -> None:
    _run(fragscope_group, "fragscope")
