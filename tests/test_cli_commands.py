"""Every command of both entry points is reachable and its help renders; ``diagnose trace FILE`` and
``diagnose FILE`` import only what they run (the command modules are loaded on first use)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from fragscope import cli

DATA = os.path.join(os.path.dirname(__file__), "data")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The commands users have: a new one is added here, in cli.DIAGNOSE_COMMANDS / FRAGSCOPE_COMMANDS and its module.
DIAGNOSE = {"run", "explain", "trace", "snapshot", "logs", "nvidia-smi", "ort-profile", "triton-batching", "scrape"}
FRAGSCOPE = {"agent", "record", "capture", "kv-budget", "mcp", "size", "diagnose"}


def test_lazy_tables_name_what_each_module_registers():
    assert set(cli.diagnose_group.list_commands(None)) == DIAGNOSE
    assert set(cli.fragscope_group.list_commands(None)) == FRAGSCOPE
    cli.load_all_commands()
    assert set(cli.diagnose_group.commands) == DIAGNOSE == set(cli.DIAGNOSE_COMMANDS)
    assert set(cli.fragscope_group.commands) == FRAGSCOPE == set(cli.FRAGSCOPE_COMMANDS) | {"diagnose"}
    for group, table in ((cli.diagnose_group, cli.DIAGNOSE_COMMANDS), (cli.fragscope_group, cli.FRAGSCOPE_COMMANDS)):
        for name, module in table.items():
            assert group.commands[name].callback.__module__ == f"fragscope.cli.{module}", name


def _paths():
    for name in sorted(DIAGNOSE):
        yield "diagnose", [name]
        yield "fragscope", ["diagnose", name]
    for name in sorted(FRAGSCOPE):
        yield "fragscope", [name]
    yield "diagnose", []
    yield "fragscope", []


@pytest.mark.parametrize("prog,path", list(_paths()), ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_every_command_is_reachable_and_its_help_renders(prog, path):
    group = cli.diagnose_group if prog == "diagnose" else cli.fragscope_group
    r = CliRunner().invoke(group, [*path, "--help"], prog_name=prog, terminal_width=120)
    assert r.exit_code == 0, r.output
    assert r.output.startswith("Usage: ") and "--help" in r.output
    if path in ([], ["diagnose"]):
        listed = r.output.split("Commands:")[1]
        names = DIAGNOSE if (prog == "diagnose" or path) else FRAGSCOPE
        for name in names:
            assert f"  {name} " in listed or f"  {name}\n" in listed, name


def _modules_after(args: list[str]) -> tuple[int, set[str]]:
    """Run ``diagnose ARGS`` in a fresh interpreter; its exit code and the modules it imported."""
    code = ("import contextlib, io, json, sys\n"
            "from fragscope.cli import cli_exit_code, diagnose_group\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = cli_exit_code(diagnose_group, 'diagnose', sys.argv[1:])\n"
            "print(json.dumps({'rc': rc, 'modules': sorted(sys.modules)}))\n")
    env = {**os.environ, "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return out["rc"], set(out["modules"])


# Never on these paths: the other commands' modules, the agent, the fleet, HTTP clients, rich, pandas.
OTHER_COMMANDS = {f"fragscope.cli.{m}" for m in cli.COMMAND_MODULES}
NEVER = {"fragscope.agent.live", "fragscope.agent.client", "fragscope.agent.store", "fragscope.fleet",
         "fragscope.collectors.endpoint", "fragscope.collectors.http", "fragscope.report.html",
         "fragscope.report.agent_page", "requests", "urllib3", "http.client", "rich", "pandas"}


def _bad(modules: set[str], never: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in never))


# What a trace diagnosis never needs: the window diagnoses' detectors (and what they import), the sizing
# arithmetic, the log parsers, the metrics pipeline.
WINDOW_DETECTORS = {f"fragscope.detectors.{m}" for m in
                    ("fragmentation", "kv_pressure", "memory_leak", "throttling", "launch_bound", "saturation",
                     "block_size", "kv_pool", "cpu_starved", "stalled", "straggler", "gpu_fault", "host_memory",
                     "frame", "batching", "cpu_fallback")}
NOT_FOR_A_TRACE = WINDOW_DETECTORS | {"fragscope.agent", "fragscope.sizing", "fragscope.pipeline", "fragscope.signals",
                                      "fragscope.collectors.exposition", "fragscope.collectors.nsys",
                                      "fragscope.collectors.enginelog", "fragscope.advice.jobs"}


def test_window_detector_list_is_the_registrys():
    from fragscope.playbooks import window

    assert {f"fragscope.detectors.{m}" for m in window.MODULES} <= WINDOW_DETECTORS


def test_diagnose_trace_imports_only_the_trace_path():
    rc, mods = _modules_after(["trace", os.path.join(DATA, "trace", "hta_timeline_sampled_rank0.json.gz"),
                               "--format", "json"])
    assert rc == 0  # no finding in this trace: no playbook is built, so the registry stays unloaded
    never = NEVER | (OTHER_COMMANDS - {"fragscope.cli.trace_cmd"}) | NOT_FOR_A_TRACE | {"fragscope.playbooks"}
    assert _bad(mods, never) == []
    assert "fragscope.cli.trace_cmd" in mods and "fragscope.collectors.kineto" in mods
    assert "numpy" not in mods  # a small trace: read and analysed in Python lists (fragscope.vec)


def test_diagnose_trace_with_a_finding_loads_only_its_playbook():
    for name in ("hta_alexnet_critical_path.json.gz", "hta_step_based_gpu_user_annotation.json.gz"):
        rc, mods = _modules_after(["trace", os.path.join(DATA, "trace", name), "--format", "json", "--fail-on",
                                   "never"])
        assert rc == 0 and "fragscope.playbooks" in mods, name  # allocator-stalls: its playbook from the registry
        never = NEVER | (OTHER_COMMANDS - {"fragscope.cli.trace_cmd"}) | NOT_FOR_A_TRACE
        assert _bad(mods, never) == [], name
        assert "numpy" not in mods, name


def test_a_large_trace_takes_numpy(tmp_path):
    """Above the size bar the columns are numpy arrays (the same figures: tests/test_trace_vectors.py)."""
    from fragscope import vec

    n = vec.NUMPY_MIN_ROWS // 2 + 1
    ev = []
    for i in range(n):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10 * i,
                   "dur": 2, "args": {"correlation": i + 1}})
        ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10 * i + 3, "dur": 4,
                   "args": {"correlation": i + 1, "device": 0, "stream": 7}})
    p = tmp_path / "big.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    rc, mods = _modules_after(["trace", str(p), "--format", "json", "--fail-on", "never"])
    assert rc == 0 and "numpy" in mods


def test_diagnose_file_imports_no_http_agent_or_other_commands():
    rc, mods = _modules_after([os.path.join(DATA, "collectors", "vllm_cpu_0.32.0_tiny.metrics.txt"),
                               "--format", "json", "--fail-on", "never"])
    assert rc == 0
    # diagnose_cmd's options come from agent_cmds (--agent, --vllm) and fleet_cmds (--prometheus); the
    # agent's defaults (port) from agent.config: nothing of the agent that runs
    keep = {"fragscope.cli.diagnose_cmd", "fragscope.cli.agent_cmds", "fragscope.cli.fleet_cmds"}
    never = NEVER | (OTHER_COMMANDS - keep) | {"fragscope.cli.trace_cmd", "fragscope.collectors.kineto"}
    assert _bad(mods, never) == []
    assert "fragscope.pipeline" in mods
    assert sorted(m for m in mods if m.startswith("fragscope.agent.")) == ["fragscope.agent.config"]


# What `diagnose FILE` of a metrics recording does not need (docs/performance.md, "Start-up"): the engine-log
# patterns and the start-up log reader (the KV-pool sizing from metrics uses sizing.accounting), numpy.ma
# (fragscope.npstats instead of np.median / np.quantile / np.unique), HTML entities, the TOML reader, and the
# deep-evidence diagnoses' modules (the registry's window list loads the window sources alone).
RECORDING_NEVER = {"numpy.ma", "fragscope.collectors.enginelog.patterns", "fragscope.collectors.enginelog.parser",
                   "fragscope.collectors.enginelog.reader", "fragscope.sizing.startup", "fragscope.sizing.wordings",
                   "html", "tomllib", "fragscope.detectors.cpu_fallback", "fragscope.collectors.ort_profile",
                   "fragscope.trace_playbooks", "fragscope.detectors.timeline_config"}


@pytest.mark.parametrize("name", ["kv-pressure-incident", "fragmentation-incident"])
def test_diagnose_recording_skips_log_patterns_numpy_ma_and_toml(name):
    rc, mods = _modules_after([os.path.join(ROOT, "examples", f"{name}.om.gz"), "--format", "json",
                               "--fail-on", "never"])
    assert rc == 0 and "fragscope.detectors.kv_pool" in mods and "fragscope.sizing.accounting" in mods
    assert _bad(mods, NEVER | RECORDING_NEVER) == []
