"""The console entry ends a finished ``diagnose trace`` without the interpreter's teardown only when that
is safe (the command allowed it, one thread, no exit handler), after flushing; the output and exit code
are the same as with the usual exit."""
from __future__ import annotations

import atexit
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fragscope.cli import base as common  # (exit_now and its switch live in base, without click)

DATA = Path(__file__).parent / "data" / "trace"
ALEXNET = DATA / "hta_alexnet_critical_path.json.gz"


@pytest.fixture
def exits(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(common.os, "_exit", calls.append)
    monkeypatch.setattr(common, "_EXIT_WITHOUT_TEARDOWN", [False])
    monkeypatch.setattr(atexit, "_ncallbacks", lambda: 0)  # (pytest's own handlers aside)
    # threads the test runner already runs (xdist's channel, other tests' servers) aside: this test's own count
    real, base = threading.active_count, threading.active_count()
    monkeypatch.setattr(threading, "active_count", lambda: real() - base + 1)
    return calls


def test_exit_now_only_when_the_command_allowed_it(exits):
    common.exit_now(1)
    assert exits == []
    common.exit_without_teardown()
    common.exit_now(1)
    assert exits == [1]


def test_exit_now_not_with_another_thread_or_an_exit_handler(exits, monkeypatch):
    common.exit_without_teardown()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        common.exit_now(0)
    finally:
        stop.set()
        t.join()
    assert exits == []

    monkeypatch.setattr(atexit, "_ncallbacks", lambda: 1)  # one exit handler registered
    common.exit_now(0)
    assert exits == []
    monkeypatch.setattr(atexit, "_ncallbacks", lambda: 0)
    common.exit_now(0)
    assert exits == [0]


@pytest.mark.parametrize("args", [["--format", "json"], ["--format", "human", "--fail-on", "info"]])
def test_console_entry_prints_and_exits_as_in_process(args, tmp_path):
    """The console entry (which may skip the teardown) against the same command run in-process through
    cli_exit_code (which never does): same stdout, stderr and exit code."""
    # the console entry, the interpreter's own exit handlers aside (a site hook may register one), and a
    # mark on stderr when the process ends through os._exit: the path under test is the one taken
    entry = ("import atexit, os, sys\natexit._clear()\nfrom fragscope.cli import diagnose_main\nreal = os._exit\n"
             "os._exit = lambda c: (sys.stderr.write('exit-now'), sys.stderr.flush(), real(c))\ndiagnose_main()")
    inproc = ("import sys\nfrom fragscope.cli import cli_exit_code, diagnose_group\n"
              "rc = cli_exit_code(diagnose_group, 'diagnose')\nsys.stdout.flush()\nsys.exit(rc)")
    html = tmp_path / "r.html"
    a = subprocess.run([sys.executable, "-c", entry, "trace", str(ALEXNET), *args, "--html", str(html)],
                       capture_output=True)
    html_a = html.read_bytes()
    b = subprocess.run([sys.executable, "-c", inproc, "trace", str(ALEXNET), *args, "--html", str(html)],
                       capture_output=True)
    assert a.stderr.endswith(b"exit-now")
    assert a.stdout and a.stdout == b.stdout and a.stderr[:-8] == b.stderr and a.returncode == b.returncode
    assert html_a.rstrip().endswith(b"</html>") and len(html_a) > 1000  # written whole, file closed
    # output through a pipe that is read to the end: nothing lost in the buffers
    c = subprocess.run([sys.executable, "-c", entry, "trace", str(ALEXNET), *args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    assert c.stdout == a.stdout and c.returncode == a.returncode
