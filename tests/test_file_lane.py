"""The console entry's plain ``diagnose FILE`` (fragscope/cli/file_lane.py: run without importing click) against
the same command line through click: stdout, stderr and exit code byte for byte, on recordings, scrapes and
pastes, on files another subcommand reads (rerouted by click's command, with its note), on broken and missing
files; and which command lines import click at all (each run in a fresh interpreter)."""
from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fragscope.cli.file_lane import plain_args

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
EXAMPLE = ROOT / "examples" / "fragmentation-incident.om.gz"
SCRAPE = DATA / "collectors" / "vllm_v1_cncf_kops.metrics.txt"
ENTRY = "from fragscope.cli import diagnose_main as m; m(lane={lane})"
CLICK_LINE = re.compile(r"^import time: .*\|\s+click$", re.M)


def _run(args: list[str], lane: bool, cwd: Path = ROOT, env: dict | None = None) -> tuple[bytes, bytes, int, bool]:
    """(stdout, stderr without import-time lines, exit code, whether click was imported)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", ENTRY.format(lane=lane), *args],
                          capture_output=True, timeout=120, cwd=cwd, env=env)
    err = proc.stderr.decode("utf-8", "surrogateescape")
    imported = bool(CLICK_LINE.search(err))
    rest = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("import time:"))
    return proc.stdout, rest.encode("utf-8", "surrogateescape"), proc.returncode, imported


def _same(args: list[str], cwd: Path = ROOT, env: dict | None = None) -> bool:
    """Assert the lane run and the click run agree byte for byte; return whether the lane run imported click."""
    out_on, err_on, rc_on, click_on = _run(args, True, cwd, env)
    out_off, err_off, rc_off, click_off = _run(args, False, cwd, env)
    assert (rc_on, err_on, out_on) == (rc_off, err_off, out_off)
    assert click_off
    return click_on


@pytest.mark.parametrize("path,opts", [
    (EXAMPLE, ["--format", "json"]),  # a recording (gzip), read in the entry's child where it pays
    (EXAMPLE, ["--no-color", "--fail-on", "never"]),
    (SCRAPE, []),  # one /metrics scrape
    (DATA / "collectors" / "pastes" / "vllm_issue7782_quoted_no_hash.paste.txt", ["--format", "json"]),
], ids=["recording-json", "recording-human", "scrape", "paste"])
def test_plain_diagnose_file_same_output_without_click(path, opts):
    assert not _same([str(path), *opts])


def test_a_log_or_a_trace_given_to_diagnose_file_is_rerouted_by_click_the_same():
    log = sorted((DATA / "logs").glob("*.log"))[0]
    trace = DATA / "trace" / "hta_inference_rank1_runtime_kernel_cats.json.gz"
    for path in (log, trace):
        assert _same([str(path), "--format", "json"])  # the lane hands it to click's command (its reroute note)


HOSTILE = {"empty.om": b"", "truncated.om.gz": None, "bad-utf8.om": b"x{a=\"\xff\"} 1 1700000000\n",
           "garbage.om": b"hello world\n" * 40, "nul.om": b"\0" * 4096, "no-timestamps-no-meta.om": b"foo 1\nbar 2\n"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.e2e] if i >= 3 else [])  # (3 in the fast suite)
                                  for i, n in enumerate(HOSTILE)])
def test_broken_and_hostile_files_same_error(tmp_path, name):
    data = HOSTILE[name] if HOSTILE[name] is not None else gzip.compress(EXAMPLE.read_bytes())[:300]
    (tmp_path / name).write_bytes(data)
    _same([str(tmp_path / name)])


def test_missing_files_and_directories_same_error(tmp_path):
    assert _same([str(tmp_path / "missing.om")])  # not a file: click's path, its own message
    assert _same([str(tmp_path)])  # a directory


OTHER_FORMS = [["{f}", "--since", "1h"], ["{f}", "--html", "{html}"], ["{f}", "--format=json"], ["{f}", "-h"],
               ["{f}", "--format", "xml"], ["{f}", "{f}"], ["{f}", "--debug"], ["{f}", "--scrape-interval", "15s"],
               ["{f}", "--format", "json", "--format", "human"]]


@pytest.mark.parametrize("form", OTHER_FORMS, ids=lambda f: " ".join(f))
def test_every_other_command_line_goes_through_click(tmp_path, form):
    args = [a.format(f=SCRAPE, html=tmp_path / "r.html") for a in form]
    plain = plain_args(args)
    assert plain is None or "--since" in plain or "--html" in plain
    assert _run(args, True)[3]  # click imported


def test_plain_args_reads_only_the_plain_forms(tmp_path):
    f = str(SCRAPE)
    assert plain_args([f]) == {"file": f}
    assert plain_args(["--no-color", f, "--fail-on", "never"]) == {"--no-color": True, "file": f, "--fail-on": "never"}
    assert plain_args([f, "--format", "JSON"]) is None  # click's choices are exact
    assert plain_args([str(tmp_path)]) is None and plain_args([""]) is None


def test_a_bug_inside_the_command_is_answered_the_same():
    code = ("import fragscope.cli.file_run as r\n"
            "def boom(*a, **k):\n    raise RuntimeError('x')\n"
            "r.diagnose_path = boom\nfrom fragscope.cli import diagnose_main\ndiagnose_main(lane={lane})")
    runs = [subprocess.run([sys.executable, "-c", code.format(lane=lane), str(SCRAPE)], capture_output=True,
                           timeout=120, cwd=ROOT, env={**os.environ, "FRAGSCOPE_READ_CHILD": "0"})
            for lane in (True, False)]
    assert (runs[0].returncode, runs[0].stderr, runs[0].stdout) == (runs[1].returncode, runs[1].stderr, runs[1].stdout)
    assert runs[0].returncode == 3
