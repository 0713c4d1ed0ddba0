"""The console entry's plain ``diagnose trace FILE`` (fragscope/cli/__init__.py: run without importing click)
against the same command line through click: stdout, stderr and exit code byte for byte, on every trace in
tests/data/trace, on broken and missing files and on every command line the entry reads itself; and which
command lines import click at all (each run in a fresh interpreter)."""
from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fragscope.cli import plain_trace_args

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted(p for p in (ROOT / "tests" / "data" / "trace").rglob("*") if p.is_file())
SMALL = ROOT / "tests" / "data" / "trace" / "hta_inference_rank1_runtime_kernel_cats.json.gz"
ALEXNET = ROOT / "tests" / "data" / "trace" / "hta_alexnet_critical_path.json.gz"
assert ALEXNET in TRACES  # its --format json and human runs are in test_every_trace_same_output_...
ENTRY = {"diagnose": "from fragscope.cli import diagnose_main as m; m(lane={lane})",
         "fragscope": "from fragscope.cli import main as m; m(lane={lane})"}
CLICK_LINE = re.compile(r"^import time: .*\|\s+click$", re.M)


def _run(args: list[str], lane: bool, entry: str = "diagnose", cwd: Path = ROOT) -> tuple[bytes, bytes, int, bool]:
    """(stdout, stderr without import-time lines, exit code, whether click was imported)."""
    argv = ["diagnose", *args] if entry == "fragscope" else args
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", ENTRY[entry].format(lane=lane), *argv],
                          capture_output=True, timeout=120, cwd=cwd)
    err = proc.stderr.decode("utf-8", "surrogateescape")
    imported = bool(CLICK_LINE.search(err))
    rest = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("import time:"))
    return proc.stdout, rest.encode("utf-8", "surrogateescape"), proc.returncode, imported


def _same(args: list[str], entry: str = "diagnose", cwd: Path = ROOT) -> bool:
    """Assert the two runs agree byte for byte; return whether the lane run imported click."""
    out_on, err_on, rc_on, click_on = _run(args, True, entry, cwd)
    out_off, err_off, rc_off, click_off = _run(args, False, entry, cwd)
    assert (rc_on, err_on, out_on) == (rc_off, err_off, out_off)
    assert click_off
    return click_on


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
@pytest.mark.parametrize("fmt", ["human", "json"])
def test_every_trace_same_output_with_and_without_click(path, fmt):
    click_on = _same(["trace", str(path), "--format", fmt])
    assert not click_on  # a plain file: the lane took it


def _hostile(tmp_path: Path) -> dict[str, Path]:
    good = gzip.decompress(SMALL.read_bytes())
    files = {"empty": b"", "not-json": b"hello", "truncated-json": good[: len(good) // 2],
             "truncated-gzip": SMALL.read_bytes()[:200], "json-array": b"[1, 2, 3]",
             "events-not-a-list": b'{"traceEvents": 5}', "no-gpu-ops": b'{"traceEvents": []}',
             "nul-bytes": b"\0" * 4096, "sqlite-header-only": b"SQLite format 3\0" + b"\0" * 84}
    out = {}
    for name, data in files.items():
        p = tmp_path / f"{name}.json"
        p.write_bytes(data)
        out[name] = p
    return out


@pytest.mark.parametrize("kind", ["empty", "not-json", "truncated-json", "truncated-gzip", "json-array",
                                  "events-not-a-list", "no-gpu-ops", "nul-bytes", "sqlite-header-only"])
def test_broken_files_same_error_with_and_without_click(tmp_path, kind):
    path = _hostile(tmp_path)[kind]
    _same(["trace", str(path)])
    _same(["trace", str(path), "--format", "json"])


def test_odd_names_missing_files_and_directories_same(tmp_path):
    styled = tmp_path / "a\x1b[31mred name.json.gz"  # click takes the ESC sequence out off a terminal
    styled.write_bytes(SMALL.read_bytes())
    _same(["trace", str(styled)])
    _same(["trace", str(styled), "--format", "json"])
    for name, data in (("good-\udcff.json.gz", SMALL.read_bytes()), ("bad-\udcff.json", b"{")):  # not UTF-8
        (tmp_path / name).write_bytes(data)
        _same(["trace", str(tmp_path / name)])
    assert _same(["trace", str(tmp_path / "missing.json")])  # not a file: click's path
    assert _same(["trace", str(tmp_path)])  # a directory: the ranks of one job, through click
    dash = tmp_path / "-x.json"
    dash.write_bytes(SMALL.read_bytes())
    assert _same(["trace", "-x.json"], cwd=tmp_path)  # an option to click


# `trace FILE --format json|human` on this trace is test_every_trace_same_output_with_and_without_click's own
# command line (the same four processes, the same assertions): not run twice
LANE_FORMS = [[], ["--fail-on", "never"], ["--fail-on", "info"],
              ["--format", "json", "--fail-on", "warning"], ["--fail-on", "critical", "--format", "human"]]


@pytest.mark.parametrize("opts", LANE_FORMS, ids=lambda o: " ".join(o) or "plain")
def test_every_form_the_lane_reads_same_without_click(opts):
    path = str(ALEXNET)
    assert not _same(["trace", path, *opts] if len(opts) < 4 else ["trace", *opts, path])  # (FILE anywhere)


def test_fragscope_diagnose_trace_same_without_click():
    assert not _same(["trace", str(SMALL), "--fail-on", "info"], entry="fragscope")
    assert _same(["trace", "--help"], entry="fragscope")


OTHER_FORMS = [["trace", "{f}", "--format=json"], ["trace", "{f}", "--format", "xml"], ["trace", "--help"],
               ["trace", "{f}", "--fail-on"], ["trace", "{f}", "--format", "json", "--format", "human"],
               ["trace", "{f}", "{f}"], ["trace", "--", "{f}"], ["trace", "{f}", "--debug"],
               ["--debug", "trace", "{f}"], ["trace", "{f}", "--max-json-bytes", "1KiB"], ["trace", "{f}", "-h"],
               ["trace", "{f}", "--unknown"], ["{f}"], ["trace"], ["TRACE", "{f}"]]


@pytest.mark.parametrize("form", OTHER_FORMS, ids=lambda f: " ".join(f))
def test_every_other_command_line_goes_through_click(form):
    args = [a.format(f=SMALL) for a in form]
    assert plain_trace_args(args) is None
    assert _run(args, True)[3]  # click imported (the output is click's own: the same code runs either way)


def test_plain_trace_args_reads_only_the_plain_forms(tmp_path):
    f = str(SMALL)
    assert plain_trace_args(["trace", f]) == (f, "human", "critical")
    assert plain_trace_args(["trace", "--fail-on", "never", f, "--format", "json"]) == (f, "json", "never")
    assert plain_trace_args(["trace", f, "--format", "JSON"]) is None  # click's choices are exact
    assert plain_trace_args(["trace", ""]) is None
    assert plain_trace_args(["trace", str(tmp_path)]) is None


RAISE = ("import errno, sys\nimport fragscope.cli.trace_run as t\n"
         "def boom(*a, **k):\n    sys.stdout.write('partial'); raise {exc}\n"
         "t.run_trace = boom\nfrom fragscope.cli import diagnose_main\ndiagnose_main(lane={lane})")


@pytest.mark.parametrize("exc", ["KeyboardInterrupt()", "EOFError()", "OSError(errno.EPIPE, 'Broken pipe')",
                                 "BrokenPipeError(errno.EPIPE, 'Broken pipe')", "OSError(errno.EIO, 'I/O')",
                                 "RuntimeError('x\\ny')", "MemoryError()"])
def test_what_escapes_the_command_is_answered_the_same(exc):
    """Ctrl-C, a closed pipe and a bug inside the command: the same lines on stderr and exit code both ways
    (click's Command.main and cli_exit_code answer them on the click path)."""
    runs = [subprocess.run([sys.executable, "-c", RAISE.format(exc=exc, lane=lane), "trace", str(SMALL)],
                           capture_output=True, timeout=120, cwd=ROOT) for lane in (True, False)]
    assert (runs[0].returncode, runs[0].stderr, runs[0].stdout) == (runs[1].returncode, runs[1].stderr, runs[1].stdout)
    assert runs[0].returncode in (1, 3, 130)


def test_debug_env_and_shell_completion_go_through_click():
    import os

    for var in ("FRAGSCOPE_DEBUG", "_DIAGNOSE_COMPLETE"):
        r = subprocess.run([sys.executable, "-X", "importtime", "-c", ENTRY["diagnose"].format(lane=True), "trace",
                            str(SMALL)], capture_output=True, timeout=120, cwd=ROOT, env={**os.environ, var: "1"})
        assert CLICK_LINE.search(r.stderr.decode("utf-8", "replace")), var


def test_closed_stdout_same_exit_and_stderr():
    r, w = __import__("os").pipe()
    __import__("os").close(r)
    try:
        runs = [subprocess.run([sys.executable, "-c", ENTRY["diagnose"].format(lane=lane), "trace", str(TRACES[0]),
                                "--format", "json"], stdout=w, stderr=subprocess.PIPE, timeout=120, cwd=ROOT)
                for lane in (True, False)]
    finally:
        __import__("os").close(w)
    assert (runs[0].returncode, runs[0].stderr) == (runs[1].returncode, runs[1].stderr)
