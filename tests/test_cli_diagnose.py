"""`diagnose FILE` end to end: output, JSON contract, exit codes. In process through the CLI's own entry
(fragscope.cli.cli_exit_code: the same error and exit-code handling as the console script), and one real
subprocess smoke test per entry point (test_console_scripts_smoke)."""
from __future__ import annotations

import json

import pytest

from fragscope.scenarios import Scenario, write_openmetrics, write_prometheus_text

from cli_helpers import ROOT, cli, real_cli  # noqa: E402


def test_console_scripts_smoke(frag_file):
    """The real entry points as a user runs them: exit code, stdout, one-line errors on stderr."""
    r = real_cli(frag_file, "--format", "json")
    assert r.returncode == 1 and json.loads(r.stdout)["findings"][0]["id"] == "allocator-fragmentation"
    r = real_cli("/no/such/file.om")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = real_cli("kv-budget", "--help", prog="fragscope")
    assert r.returncode == 0 and "kv-budget" in r.stdout


@pytest.fixture(scope="module")
def frag_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("rec") / "frag.om.gz"
    write_openmetrics(Scenario(kind="allocator-fragmentation", step_s=30), str(p))
    return str(p)


@pytest.fixture(scope="module")
def healthy_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("rec") / "healthy.prom"
    write_prometheus_text(Scenario(kind="healthy", engine="v0", gpu_source="dcgm", step_s=30,
                                   duration_s=4 * 3600), str(p))
    return str(p)


def test_json_contract_and_exit_code(frag_file):
    r = cli(frag_file, "--format", "json")
    assert r.returncode == 1, r.stderr  # critical finding, default --fail-on critical
    d = json.loads(r.stdout)
    assert set(d) >= {"window", "findings", "inconclusive", "signals"}
    assert d["window"]["start"] < d["window"]["end"]
    f = d["findings"][0]
    assert f["id"] == "allocator-fragmentation" and f["severity"] == "critical"
    assert set(f) >= {"id", "severity", "confidence", "onset", "summary", "evidence", "missing", "playbook"}
    ev = f["evidence"][0]
    assert set(ev) >= {"signal", "observed", "baseline", "threshold", "window"}
    assert f["playbook"]["durable"][1]["contraindications"]  # expandable_segments has them
    sev_rank = {"critical": 2, "warning": 1, "info": 0}
    ranks = [(sev_rank[x["severity"]], x["confidence"]) for x in d["findings"]]
    assert ranks == sorted(ranks, reverse=True)


def test_fail_on_controls_exit(frag_file, healthy_file):
    assert cli(frag_file, "--fail-on", "never").returncode == 0
    r = cli(healthy_file)
    assert r.returncode == 0 and "No finding" in r.stdout, r.stdout + r.stderr
    assert cli(healthy_file, "--fail-on", "info").returncode == 0


def test_human_output_has_numbers_and_fix(frag_file):
    r = cli(frag_file)
    assert "CRITICAL allocator-fragmentation" in r.stdout
    assert "tok/s" in r.stdout and "fix:" in r.stdout and "--gpu-memory-utilization" in r.stdout


@pytest.mark.parametrize("content", ["", "<html>" + "<p>x</p>\n" * 50, "m 1\n"])
def test_bad_files_exit_2_one_line(tmp_path, content):
    f = tmp_path / "bad.om"
    f.write_text(content)
    r = cli(str(f))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and str(f) in r.stderr


def test_missing_file_and_no_source():
    r = cli("/nonexistent/x.om")
    assert r.returncode == 2 and "no such file" in r.stderr
    r = cli()
    assert r.returncode == 2 and "nothing to diagnose" in r.stderr


def test_recording_without_engine_signals_is_inconclusive(tmp_path):
    f = tmp_path / "gpu_only.om"
    lines = [f'DCGM_FI_DEV_GPU_UTIL{{gpu="0"}} 50 {1700000000 + 15 * i}' for i in range(400)]
    f.write_text("\n".join(lines) + "\n# EOF\n")
    r = cli(str(f), "--format", "json")
    d = json.loads(r.stdout)
    assert r.returncode == 0 and not d["findings"]
    inc = {i["id"] for i in d["inconclusive"]}
    assert {"kv-cache-pressure", "allocator-fragmentation"} <= inc


def test_explain():
    r = cli("explain", "allocator-fragmentation")
    assert r.returncode == 0 and "not when:" in r.stdout and "expandable_segments" in r.stdout
    r = cli("explain", "nope")
    assert r.returncode == 2 and "unknown diagnosis" in r.stderr
    r = cli("explain", "kv-cache-pressure", "--format", "json")
    assert json.loads(r.stdout)["id"] == "kv-cache-pressure"


def test_usage_errors_are_one_line():
    for args in (["--bogus"], ["explain"], [ROOT]):
        r = cli(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Usage:" not in r.stderr, r.stderr
        assert " run " not in r.stderr  # the internal default command's name does not leak
