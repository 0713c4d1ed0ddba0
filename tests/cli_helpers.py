"""Running the CLI from tests: in process through its own entry (fragscope.cli.cli_exit_code, the same error and
exit-code handling as the console scripts), or as a real subprocess for the few smoke tests that need one."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, prog: str = "diagnose") -> subprocess.CompletedProcess:
    """Run a command in process; returns what subprocess.run would (returncode, stdout, stderr)."""
    from fragscope.cli import cli_exit_code, diagnose_group, fragscope_group

    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli_exit_code(diagnose_group if prog == "diagnose" else fragscope_group, prog, [str(a) for a in args])
    finally:
        os.chdir(cwd)
    return subprocess.CompletedProcess([prog, *args], rc, out.getvalue(), err.getvalue())


def real_cli(*args, prog: str = "diagnose", timeout: float = 120) -> subprocess.CompletedProcess:
    """The console script as a user runs it, in its own interpreter."""
    entry = "diagnose_main" if prog == "diagnose" else "main"
    code = f"import sys; sys.argv=[{prog!r}]+sys.argv[1:]; from fragscope.cli import {entry} as m; m()"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
