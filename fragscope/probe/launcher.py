"""``fragscope-probe``: run a command with the PyTorch allocator probe in each of its Python processes.

    fragscope-probe [--dir DIR] [--interval DURATION] [--] vllm serve MODEL ...
    fragscope-probe --print-env [--dir DIR] [--interval DURATION]

Like ``opentelemetry-instrument``: prepends the directory holding the probe's
``sitecustomize.py`` to PYTHONPATH, sets FRAGSCOPE_PROBE=1, FRAGSCOPE_PROBE_DIR and
FRAGSCOPE_PROBE_INTERVAL, then replaces itself with the command (exec), so signals and the
exit status are the command's own. Contract: docs/probe.md.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from . import core

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")


def probe_env(base: dict[str, str], probe_dir: str | None, interval: float | None) -> dict[str, str]:
    """The environment a probed command runs with (``base`` is not modified)."""
    env = dict(base)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != BOOT_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOT_DIR, *parts])
    env["FRAGSCOPE_PROBE"] = "1"
    env["FRAGSCOPE_PROBE_DIR"] = os.path.abspath(probe_dir or env.get("FRAGSCOPE_PROBE_DIR") or core.DEFAULT_DIR)
    if interval is not None:
        env["FRAGSCOPE_PROBE_INTERVAL"] = repr(float(interval))
    return env


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fragscope-probe",
        description="Run COMMAND with fragscope's PyTorch allocator probe in each of its Python processes.",
        epilog="Example: fragscope-probe --dir /var/run/fragscope vllm serve meta-llama/Llama-3.1-8B")
    p.add_argument("--dir", help=f"where the probe publishes (default $FRAGSCOPE_PROBE_DIR or {core.DEFAULT_DIR})")
    p.add_argument("--interval", help="sampling interval, e.g. 5s, 500ms, or seconds (default 5s)")
    p.add_argument("--print-env", action="store_true",
                   help="print the environment to set instead of running a command (for images/pods)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, e.g. vllm serve MODEL")
    return p


def launcher_main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.interval is not None:
        from ..units import parse_duration  # the one duration parser of every option (stdlib only)

        try:
            args.interval = parse_duration(args.interval)
        except ValueError as e:
            print(f"fragscope-probe: --interval: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    env = probe_env(dict(os.environ), args.dir, args.interval)
    if args.print_env:
        for k in ("PYTHONPATH", "FRAGSCOPE_PROBE", "FRAGSCOPE_PROBE_DIR", "FRAGSCOPE_PROBE_INTERVAL"):
            if k in env:
                print(f"export {k}={shlex.quote(env[k])}")
        raise SystemExit(0)
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("fragscope-probe: no command given; usage: fragscope-probe [--dir DIR] [--interval S] COMMAND ...",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        os.makedirs(env["FRAGSCOPE_PROBE_DIR"], exist_ok=True)
    except OSError as e:
        print(f"fragscope-probe: cannot create {env['FRAGSCOPE_PROBE_DIR']}: {e.strerror}; "
              "pass a writable --dir", file=sys.stderr)
        raise SystemExit(2)
    try:
        os.execvpe(cmd[0], cmd, env)
    except FileNotFoundError:
        print(f"fragscope-probe: {cmd[0]}: command not found", file=sys.stderr)
        raise SystemExit(127)
    except PermissionError:
        print(f"fragscope-probe: {cmd[0]}: permission denied", file=sys.stderr)
        raise SystemExit(126)
    except OSError as e:
        print(f"fragscope-probe: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        raise SystemExit(126)
