"""Whole-process timing shared by the benchmarks: fresh interpreters, as a user runs the command.

An installed fragscope (a wheel, pip) has its bytecode compiled; a checkout run with
PYTHONDONTWRITEBYTECODE=1 (as on the development VM) compiles every source file at each start (0.3-0.7 s
of `diagnose`'s start here). ``installed_env`` gives the first condition: a private bytecode cache, warmed
once, so whole-process figures compare like with like (HTA's and promtool's installs are compiled too).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WARM_MODULES = ("fragscope.cli, fragscope.cli.trace_cmd, fragscope.cli.diagnose_cmd, fragscope.collectors.nsys, "
                "fragscope.collectors.kineto, fragscope.collectors.exposition, fragscope.detectors.timeline, "
                "fragscope.trace_pipeline, fragscope.pipeline, fragscope.playbooks, fragscope.agent.live")


def installed_env(cache_dir: str | Path) -> dict:
    """The environment for a fragscope process with a warm bytecode cache in ``cache_dir``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache_dir)
    subprocess.run([sys.executable, "-c", f"import {WARM_MODULES}"], check=True, env=env, cwd=ROOT)
    return env


def whole(cmd: list[str], reps: int, env: dict | None = None, ok=(0, 1)) -> tuple[float, str]:
    """Best wall seconds of ``reps`` fresh processes running ``cmd``, and "ok" or the last error line."""
    best, status = float("inf"), "ok"
    for _ in range(reps):
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        best = min(best, time.perf_counter() - t)
        if r.returncode not in ok:
            status = f"rc={r.returncode} {(r.stderr.strip().splitlines() or [''])[-1][:80]}"
    return best, status


DIAGNOSE = [sys.executable, "-c", "from fragscope.cli import diagnose_main; diagnose_main()"]
