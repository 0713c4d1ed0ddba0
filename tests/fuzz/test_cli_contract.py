"""The CLI's crash-only exit (issue 12 item 4) and `diagnose --help` (the default command's options)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import click
from click.testing import CliRunner

from fragscope.cli import cli_exit_code, diagnose_group

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@click.group()
def _g():
    pass


@_g.command("boom")
@click.option("--kind", default="value")
def _boom(kind):
    if kind == "memory":
        raise MemoryError()
    if kind == "recursion":
        raise RecursionError("maximum recursion depth exceeded\nwhile calling a Python object")
    raise ValueError("year 10000 is out of range")


def _call(args, env=None, group=_g):
    runner = CliRunner(env=env)
    with runner.isolation(env=env) as (out, err, *_):
        rc = cli_exit_code(group, "diagnose", args)
        return rc, out.getvalue().decode(), err.getvalue().decode()


def test_escaped_exception_exits_3_with_one_line():
    rc, out, err = _call(["boom"])
    assert rc == 3 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("diagnose: internal error: ValueError: year 10000 is out of range")
    assert "--debug" in err and "FRAGSCOPE_DEBUG=1" in err


def test_multi_line_messages_and_memory_error_stay_one_line():
    rc, _, err = _call(["boom", "--kind", "recursion"])
    assert rc == 3 and err.count("\n") == 1 and "maximum recursion depth exceeded while calling" in err
    rc, _, err = _call(["boom", "--kind", "memory"])
    assert rc == 3 and err.count("\n") == 1 and "internal error: out of memory" in err


def test_debug_flag_anywhere_and_env_print_the_traceback():
    for args, env in ((["--debug", "boom"], None), (["boom", "--debug"], None), (["boom"], {"FRAGSCOPE_DEBUG": "1"})):
        rc, _, err = _call(args, env)
        assert rc == 3, args
        assert err.startswith("Traceback (most recent call last)") and 'in _boom' in err, args
        assert err.rstrip().splitlines()[-1].startswith("diagnose: internal error: ValueError"), args
    rc, _, err = _call(["boom", "--", "--debug"])  # after "--" it is an argument, not the flag
    assert rc == 2 and "Traceback" not in err


def test_usage_errors_still_exit_2():
    rc, _, err = _call(["nope"])
    assert rc == 2 and err.count("\n") == 1


def test_real_process_crash_exits_3_not_1(tmp_path):
    # a real console-script process: make the snapshot reader raise something unexpected
    p = tmp_path / "s.pickle"
    p.write_bytes(b"\x80\x04]\x94.")
    code = ("import sys; sys.argv[0] = 'diagnose'; import fragscope.collectors.snapshot as s\n"
            "def bad(*a, **k): raise KeyError('boom')\n"
            "s.read_snapshot = bad\n"
            "from fragscope.cli import diagnose_main; diagnose_main()")
    r = subprocess.run([sys.executable, "-c", code, "snapshot", str(p)], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 3, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("diagnose: internal error: KeyError: 'boom'")
    assert r.stdout == ""


def test_diagnose_help_shows_default_command_options_and_every_subcommand():
    r = CliRunner().invoke(diagnose_group, ["--help"], prog_name="diagnose")
    assert r.exit_code == 0
    out = r.output
    for opt in ("--format", "--fail-on", "--vllm", "--agent", "--prometheus", "--since", "--debug", "--version"):
        assert f"  {opt}" in out, opt
    commands = out.split("Commands:")[1]
    flat = re.sub(r"-\s+", "-", " ".join(commands.split()))  # help text wrapped at hyphens, joined again
    for name in diagnose_group.list_commands(None):  # every subcommand, its whole first paragraph
        cmd = diagnose_group.get_command(None, name)
        if not cmd.hidden:
            first = re.sub(r"-\s+", "-", " ".join((cmd.help or "").split("\n\n")[0].split()))
            assert f"  {name} " in commands and first in flat, name
    for text in ("(e.g. allocator-fragmentation).", "The file is never executed.", "Format detected by content.",
                 "(default: the command name may be left out)"):
        assert text in flat, text
    assert "Exit codes:" in out and "3 internal" in " ".join(out.split())
