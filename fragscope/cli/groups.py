"""The click groups of the two console entries (``diagnose`` and ``fragscope``) and their error handling.

Each area owns one module that registers its commands here (``register``), imported when one of its
commands runs (DIAGNOSE_COMMANDS / FRAGSCOPE_COMMANDS name it); modules are a few lines of library calls
each. Only this package imports click; ``fragscope.cli`` itself imports this module when a command line
needs click (fragscope/cli/__init__.py).
"""
from __future__ import annotations

import os
import sys

import importlib

import click

from .. import __version__
from .base import CommandError
from .common import EXIT_CRASH, EXIT_USAGE, exit_now

DEBUG_ENV = "FRAGSCOPE_DEBUG"

# Each command's module, imported when that command runs or a help lists it: `diagnose trace FILE` loads
# trace_cmd alone, not the agent's, the fleet's or the sizing commands with everything they import. A new
# command: its name here and the ``register`` of its module (tests/test_cli_commands.py checks the two agree).
DIAGNOSE_COMMANDS = {"run": "diagnose_cmd", "explain": "diagnose_cmd", "trace": "trace_cmd",
                     "snapshot": "snapshot_cmd", "logs": "logs_cmd", "nvidia-smi": "nvsmi_cmd",
                     "ort-profile": "engines_cmd", "triton-batching": "engines_cmd", "scrape": "engines_cmd"}
FRAGSCOPE_COMMANDS = {"agent": "agent_cmds", "record": "agent_cmds", "capture": "logs_cmd",
                      "kv-budget": "kv_budget_cmd", "mcp": "mcp_cmd", "size": "sizing_cmd"}
COMMAND_MODULES = ("diagnose_cmd", "kv_budget_cmd", "snapshot_cmd", "trace_cmd", "logs_cmd", "agent_cmds",
                   "fleet_cmds", "sizing_cmd", "engines_cmd", "mcp_cmd", "nvsmi_cmd")
_registered: set[str] = set()


def load_commands(module: str) -> None:
    """Import ``fragscope.cli.<module>`` and let it register its commands on both entry points (once)."""
    if module not in _registered:
        _registered.add(module)
        importlib.import_module(f"{__package__}.{module}").register(fragscope_group, diagnose_group)


def load_all_commands() -> None:
    """Every command module registered (what a help listing or a test walking the commands needs)."""
    for module in COMMAND_MODULES:
        load_commands(module)


class LazyGroup(click.Group):
    """A group whose commands' modules are imported on first use (``lazy``: command name -> module)."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            load_commands(self.lazy[cmd_name])
        return self.commands.get(cmd_name)


class DefaultGroup(LazyGroup):
    """A group whose unknown first argument falls through to a default command.

    ``diagnose FILE`` and ``diagnose --vllm URL`` run the default command; ``diagnose snapshot FILE``,
    ``diagnose trace FILE``, ``diagnose logs FILE`` and ``diagnose explain ID`` are subcommands.
    ``diagnose --help`` shows the default command's options beside the group's, and every subcommand
    with its whole first sentence (click cuts short help at ~45 characters).
    """

    default_cmd = "run"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in self.lazy
                        and args[0] not in ("--help", "-h", "--version")):
            args = [self.default_cmd, *args]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx, formatter):
        formatter.write_usage(ctx.command_path, "[FILE | URL | --agent URL | --vllm URL | --prometheus URL] [OPTIONS]\n"
                              "       diagnose snapshot|trace|logs FILE | explain ID")

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        default = self.get_command(ctx, self.default_cmd)
        if default is not None:
            rows = [r for p in default.get_params(ctx) if p.name != "help"
                    for r in [p.get_help_record(ctx)] if r is not None]
            with formatter.section(f"Options of the default command (diagnose [{self.default_cmd}] FILE ...)"):
                formatter.write_dl(rows)
        rows = [r for p in self.get_params(ctx) for r in [p.get_help_record(ctx)] if r is not None]
        with formatter.section("Global options"):
            formatter.write_dl(rows)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            text = " ".join((cmd.help or "").split("\n\n")[0].split())
            if name == self.default_cmd:
                text = f"(default: the command name may be left out) {text}"
            rows.append((name, text))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _debug_option(f):
    # Shown in --help; cli_exit_code() takes the flag out of argv itself, so it works before or after a
    # subcommand (``diagnose --debug FILE``, ``diagnose snapshot FILE --debug``).
    return click.option("--debug", is_flag=True, expose_value=False,
                        help=f"On an internal error (exit 3) print the Python traceback (env {DEBUG_ENV}=1).")(f)


@click.group(cls=DefaultGroup, lazy=DIAGNOSE_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]},
             help="Find out why a GPU model server got slow or ran out of memory.\n\nExit codes: 0 no "
                  "finding at or above --fail-on, 1 findings, 2 bad usage or unreadable input, 3 internal "
                  "error (a bug; rerun with --debug).")
@click.version_option(__version__, prog_name="diagnose")
@_debug_option
def diagnose_group() -> None:
    pass


@click.group(cls=LazyGroup, lazy=FRAGSCOPE_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]},
             help="fragscope: diagnostics agent for GPU model serving.")
@click.version_option(__version__, prog_name="fragscope")
@_debug_option
def fragscope_group() -> None:
    pass


# `fragscope diagnose ...` is the same as `diagnose ...`
fragscope_group.add_command(diagnose_group, name="diagnose")


def take_debug_flag(args: list[str]) -> tuple[list[str], bool]:
    """Remove ``--debug`` (before any ``--``) from ``args``; True when it was there or the env asks."""
    out, debug, rest = [], os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on"), False
    for a in args:
        if rest or a != "--debug":
            out.append(a)
            rest = rest or a == "--"
        else:
            debug = True
    return out, debug


def cli_exit_code(group: click.Group, prog: str, args: list[str] | None = None) -> int:
    """Run ``group`` on ``args`` (default: sys.argv[1:]) and return the exit code; never raises.

    Writes every error as one line on stderr: 2 for usage and input errors, 3 when an exception
    escaped a command (a bug: the traceback only with --debug / FRAGSCOPE_DEBUG=1). The fuzzing
    harness (tests/fuzz/) calls this in-process.
    """
    args, debug = take_debug_flag(list(sys.argv[1:] if args is None else args))
    try:
        rc = group.main(args=args, prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.UsageError as e:
        # one line, like every other input error (click's default prints a usage block)
        path = e.ctx.command_path if e.ctx is not None else prog
        if path.endswith(f" {DefaultGroup.default_cmd}"):
            path = path[: -len(DefaultGroup.default_cmd) - 1]
        click.echo(f"{prog}: error: {_one_line(e.format_message())} (see '{path} --help')", err=True)
        return EXIT_USAGE
    except (click.ClickException, CommandError) as e:
        e.show()
        return e.exit_code if e.exit_code else EXIT_USAGE
    except click.exceptions.Abort:
        click.echo(f"{prog}: aborted", err=True)
        return 130
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - crash-only exit: never a traceback, never exit 1
        return crash_exit_code(prog, e, debug)
    return rc if isinstance(rc, int) else 0


def _one_line(msg: str) -> str:
    return " ".join(msg.split()) if msg else ""


def crash_exit_code(prog: str, e: BaseException, debug: bool) -> int:
    """An exception escaped a command: exit 3 (1 means "finding found"), one line, traceback on demand."""
    if debug:
        import traceback

        traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    what = "out of memory" if isinstance(e, MemoryError) else f"{type(e).__name__}: {_one_line(str(e))[:300]}"
    hint = ("the traceback is above; please report it with the command line"
            if debug else f"rerun with --debug (or {DEBUG_ENV}=1) for the traceback and report it")
    try:
        click.echo(f"{prog}: internal error: {what.rstrip(': ')} (a bug in fragscope; {hint})", err=True)
    except Exception:  # noqa: BLE001 - stderr itself is gone: the exit code still says it
        pass
    return EXIT_CRASH


def run_and_exit(group: click.Group, prog: str) -> None:
    from .common import install_progress

    install_progress()  # a bar on stderr while reading a large input, on a terminal only
    code = cli_exit_code(group, prog)
    if 0 <= code <= 255:
        exit_now(code)  # (returns unless the command allowed it: common.exit_without_teardown)
    sys.exit(code)

