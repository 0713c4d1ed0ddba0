"""``diagnose FILE``'s parse in a forked child (fragscope/collectors/prefetch.py): the window and the errors are
read_recording's, bit for bit; the console entry starts it only for a plain command line and the output of the
whole command is the same with it and without."""
from __future__ import annotations

import glob
import gzip
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from fragscope.cli.file_lane import plain_file
from fragscope.collectors import prefetch
from fragscope.collectors.exposition import ParseError, parse_recording, read_recording

DATA = os.path.join(os.path.dirname(__file__), "data")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "fragmentation-incident.om.gz")

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")


def _same_window(a, b) -> None:
    assert list(a.series) == list(b.series)  # the order the reader met the series in
    for k, s in a.series.items():
        t = b.series[k]
        assert s.type == t.type and s.key == t.key, k
        assert s.ts.dtype == t.ts.dtype == np.float64 and s.values.dtype == t.values.dtype == np.float64
        assert s.ts.tobytes() == t.ts.tobytes() and s.values.tobytes() == t.values.tobytes(), k  # NaN, -0.0 too
    for f in ("start", "end", "source", "dropped_points", "notes", "timestamps", "scrapes",
              "scrape_interval_known"):
        x, y = getattr(a, f), getattr(b, f)
        assert x == y or (x != x and y != y), f


def _via_child(path: str):
    assert prefetch.spawn(path)
    return prefetch.read(path)


def _inputs() -> list[str]:
    files = [EXAMPLE, os.path.join(DATA, "collectors", "vllm_v1_cncf_kops.metrics.txt"),
             os.path.join(DATA, "collectors", "dcgm_l4_cncf_kops.metrics.txt")]
    files += sorted(glob.glob(os.path.join(DATA, "collectors", "pastes", "*.txt")))[:3]
    files += sorted(glob.glob(os.path.join(DATA, "collectors", "scrapes", "*")))[:3]
    return files


@pytest.mark.parametrize("path", _inputs(), ids=os.path.basename)
def test_child_gives_read_recordings_window_or_error(path):
    try:
        want = read_recording(path)
    except ParseError as e:
        with pytest.raises(ParseError) as got:
            _via_child(path)
        assert (str(got.value), got.value.reader) == (str(e), e.reader)
    else:
        _same_window(_via_child(path), want)


def test_recording_with_nan_duplicates_ms_and_dcgm_blanks_is_the_same(tmp_path):
    p = tmp_path / "odd.prom"
    lines = ["# TYPE vllm:num_requests_running gauge"]
    for i in range(300):
        lines.append(f'vllm:num_requests_running{{model_name="m"}} {"NaN" if i % 17 == 0 else i * 0.1} '
                     f"{1_700_000_000_000 + 15_000 * (i - (i % 50 == 0))}")
        lines.append(f'DCGM_FI_DEV_FB_USED{{gpu="0"}} {9.2e18 if i % 13 == 0 else -0.0 if i % 7 == 0 else i} '
                     f"{1_700_000_000_000 + 15_000 * i}")
    p.write_text("\n".join(lines) + "\n")
    _same_window(_via_child(str(p)), read_recording(str(p)))


@pytest.mark.parametrize("content,reader", [(b"\x00\x01garbage" * 50, None),
                                            (b'{"traceEvents": [{"ph": "X"}]}', "trace"),
                                            (b"", None)])
def test_errors_come_back_as_the_readers(tmp_path, content, reader):
    p = tmp_path / "bad.txt"
    p.write_bytes(content)
    with pytest.raises(ParseError) as want:
        read_recording(str(p))
    with pytest.raises(ParseError) as got:
        _via_child(str(p))
    assert (str(got.value), got.value.reader) == (str(want.value), want.value.reader)
    assert want.value.reader == reader or reader is None


def test_truncated_gzip_and_missing_file(tmp_path):
    p = tmp_path / "cut.om.gz"
    with open(EXAMPLE, "rb") as fh:
        p.write_bytes(fh.read()[:20000])
    for path in (str(p), str(tmp_path / "absent.om")):
        with pytest.raises(ParseError) as want:
            read_recording(path)
        with pytest.raises(ParseError) as got:
            _via_child(path)
        assert str(got.value) == str(want.value)


def test_nothing_pending_reads_none_and_abandoned_children_are_ended(tmp_path):
    assert prefetch.read(EXAMPLE) is None
    assert prefetch.spawn(EXAMPLE) and not prefetch.spawn(EXAMPLE)  # one child per path
    prefetch.abandon()  # what the console entry does when the command never read it
    assert prefetch.read(EXAMPLE) is None


def test_small_files_are_parsed_in_process(tmp_path, monkeypatch):
    p = tmp_path / "small.om"
    p.write_text('m{a="1"} 1 1700000000\n# EOF\n')
    monkeypatch.setattr(prefetch, "busy", lambda: (0.0, 0))
    assert not prefetch.worthwhile(str(p))
    monkeypatch.setenv(prefetch.ENV_READ_CHILD, "1")
    import threading

    assert prefetch.worthwhile(str(p)) == (sys.platform.startswith("linux") and threading.active_count() == 1)
    monkeypatch.setenv(prefetch.ENV_READ_CHILD, "0")
    assert not prefetch.worthwhile(EXAMPLE)
    big = tmp_path / "big.om.gz"
    with open(EXAMPLE, "rb") as fh:
        big.write_bytes(fh.read())
    assert len(gzip.decompress(big.read_bytes())) > prefetch.MIN_BYTES


@pytest.mark.parametrize("args,want", [
    (["F"], "F"),
    (["F", "--format", "json", "--fail-on", "never"], "F"),
    (["--no-color", "--since", "1h", "F", "--html", "out.html"], "F"),
    (["F", "--format", "xml"], None),  # click's error, not a read
    (["F", "--format", "json", "--format", "human"], None),
    (["F", "--scrape-interval", "15s"], None),  # changes how the file is read
    (["F", "--format=json"], None),
    (["F", "G"], None),
    (["trace", "F"], None),
    (["F", "--debug"], None),
    (["--vllm", "http://x:8000"], None),
    (["F", "--format"], None),
    ([], None),
    (["missing"], None),
])
def test_plain_file_command_lines(tmp_path, monkeypatch, args, want):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "F").write_text("m 1 1700000000\n")
    (tmp_path / "G").write_text("m 1 1700000000\n")
    assert plain_file(args) == want


def test_diagnose_file_output_same_with_the_child_and_without(capsys, tmp_path):
    """The console entry in a fresh interpreter (the child reads the file; the process ends through os._exit
    once the report is written) against click in this process: the same stdout, stderr, exit code and HTML."""
    from fragscope.cli import cli_exit_code, diagnose_group

    html = tmp_path / "r.html"
    args = [EXAMPLE, "--format", "json", "--fail-on", "warning", "--html", str(html)]
    code = ("import atexit, os, sys\natexit._clear()\nfrom fragscope.collectors import prefetch\n"
            "from fragscope.cli import diagnose_main\nreal, me = os._exit, os.getpid()\n"
            "os._exit = lambda c: (os.getpid() == me and (sys.stderr.write(f'exit-now {prefetch.spawned}'),\n"
            "                                            sys.stderr.flush()), real(c))\n"
            "diagnose_main()\n")
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT, prefetch.ENV_READ_CHILD: "1"}, cwd=ROOT)
    html_entry = html.read_bytes()
    rc = cli_exit_code(diagnose_group, "diagnose", args)
    out, err = capsys.readouterr()
    assert (p.returncode, p.stdout, p.stderr) == (rc, out, err + "exit-now 1") and rc == 1
    assert '"allocator-fragmentation"' in out
    gen = re.compile(rb"generated \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ")  # the HTML's clock line
    assert gen.sub(b"", html_entry) == gen.sub(b"", html.read_bytes()) and html_entry.rstrip().endswith(b"</html>")


def test_child_killed_while_it_hands_back_reads_none(tmp_path):
    """A child killed halfway through its hand-back (the OOM killer) leaves part of a pickle in the pipe: the
    caller reads the file itself (None), never an unpickling traceback."""
    import select
    import signal

    assert prefetch.spawn(EXAMPLE)
    pid, r = prefetch._PENDING[EXAMPLE][0]
    # the pickle of this recording is larger than a pipe's buffer: the child blocks in its write once the
    # buffer is full (bounded wait: the parse takes well under a second)
    assert select.select([r], [], [], 30.0)[0], "the child wrote nothing in 30 s"
    os.kill(pid, signal.SIGKILL)
    assert prefetch.read(EXAMPLE) is None


ORPHAN = """
import sys, time
import fragscope.collectors.exposition as e
e.parse_recording = lambda path: time.sleep(600)  # a parse that outlives its parent
from fragscope.collectors import prefetch
assert prefetch.spawn(sys.argv[1])
print(prefetch._PENDING[sys.argv[1]][0][0], flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended (nobody reaped it yet)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_child_ends_when_its_parent_is_killed():
    """SIGKILL on `diagnose FILE` runs no handler: its read's child sees its parent gone and ends within a poll
    (it would otherwise parse the whole file for nobody)."""
    import signal
    import time

    parent = subprocess.Popen([sys.executable, "-c", ORPHAN, EXAMPLE], stdout=subprocess.PIPE, cwd=ROOT)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert _running(child)
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10 * prefetch.ORPHAN_POLL_S + 5.0
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child), "the child outlived its parent"
    finally:
        parent.kill()
        if child is not None and _running(child):
            os.kill(child, signal.SIGKILL)


def _split_file(tmp_path, name: str, lines: list[str]) -> str:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def _two_families(n: int = 400, created_first: bool = False, eof_at: int | None = None, bad_at: int | None = None,
                  ms: bool = False) -> list[str]:
    out = [] if created_first else ["# TYPE vllm:num_preemptions counter"]
    half = n // 2
    for i in range(n):
        if i == half:  # the second family is declared in the second half
            out.append("# HELP vllm:kv_cache_usage_perc KV use.")
            out.append("# TYPE vllm:kv_cache_usage_perc gauge")
        t = 1_700_000_000 + 15 * i
        ts = f"{t * 1000}" if ms else f"{t}"
        out.append(f'vllm:num_preemptions_total{{model_name="m"}} {i // 3} {ts}')
        out.append(f'vllm:num_preemptions_created{{model_name="m"}} 1699999000 {ts}')
        if created_first and i == 5:
            out.append("# TYPE vllm:num_preemptions counter")  # after samples of its _created series
        if i >= half:
            out.append(f'vllm:kv_cache_usage_perc{{model_name="m"}} {0.5 + (i % 7) / 100} {ts}')
        if eof_at == i:
            out.append("# EOF")
        if bad_at == i:
            out.append("vllm:num_preemptions_total{model_name= 1 2")
    if eof_at is None:
        out.append("# EOF")
    return out


@pytest.mark.parametrize("case,joined", [
    ({}, True), ({"ms": True}, True),  # families across the cut, the second declared after it; milliseconds
    ({"created_first": True}, False),  # a _created series typed untyped before its family's TYPE line
    ({"eof_at": 60}, False),  # an # EOF in the first half: the rest is not read
    ({"bad_at": 350}, False),  # an unparsable line in the second half: its note counts the whole file
])
def test_large_plain_file_read_in_two_halves_is_the_whole_files_read(tmp_path, monkeypatch, case, joined):
    """Two children, each parsing a half of a large plain file (the second after the family types the
    first declares), give read_recording's window bit for bit; where the halves cannot tell (notes, an # EOF,
    a name typed differently in each), the caller reads the file whole."""
    monkeypatch.setattr(prefetch, "SPLIT_MIN_BYTES", 1)
    path = _split_file(tmp_path, "r.om", _two_families(**case))
    (a0, cut), (cut_b, end) = prefetch.cut_in_halves(path)
    assert a0 == 0 and cut == cut_b and 0 < cut < end == os.path.getsize(path)
    assert prefetch.spawn(path) and len(prefetch._PENDING[path]) == 2
    got = prefetch.read(path)
    assert (got is not None) == joined
    _same_window(got or read_recording(path), read_recording(path))


def test_two_halves_over_the_caps_read_whole(tmp_path, monkeypatch):
    from fragscope.collectors.exposition import ENV_MAX_POINTS

    monkeypatch.setattr(prefetch, "SPLIT_MIN_BYTES", 1)
    path = _split_file(tmp_path, "r.om", _two_families())
    monkeypatch.setenv(ENV_MAX_POINTS, "450")  # each half holds fewer points (~300), the file more (600)
    assert prefetch.spawn(path)
    assert prefetch.read(path) is None
    with pytest.raises(ParseError, match="points reached"):
        read_recording(path)


def test_declared_types_are_what_the_parse_of_the_lines_before_leaves():
    from fragscope.collectors.exposition_parse import declared_types

    text = (b"# HELP a x\n# TYPE a counter\na_total 1 2\n#TYPE b gauge\r\nc 1 2\r# TYPE a gauge\n"
            b"# TYPE ray_vllm:x histogram\n# UNIT a seconds\n# TYPE c summary\n# EOF\n")
    assert declared_types(text) == {"a": "gauge", "b": "gauge", "vllm:x": "histogram", "c": "summary"}
    assert declared_types(b"x 1 2\n") == {} and declared_types(b"# TYPE z gauge") == {"z": "gauge"}


def test_busy_cpus_read_in_process_or_in_one_child(tmp_path, monkeypatch):
    """The 1-minute load average lags: the tasks running right now decide too. Another task on each CPU: no
    child; one CPU left: one child; both idle: two halves."""
    import threading

    if not sys.platform.startswith("linux"):
        pytest.skip("forks on Linux only")
    # (threads an earlier test left in this worker: spawn forks beside them in the other tests here too)
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.delenv(prefetch.ENV_READ_CHILD, raising=False)
    for name in ("SPLIT_MIN_BYTES", "MIN_BYTES"):
        monkeypatch.setattr(prefetch, name, 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    path = _split_file(tmp_path, "r.om", _two_families())
    for busy, children in (((0.5, 2), 0), ((2.5, 0), 0), ((0.5, 1), 1), ((0.5, 0), 2)):
        monkeypatch.setattr(prefetch, "busy", lambda b=busy: b)
        assert prefetch.start(path) == bool(children)
        assert len(prefetch._PENDING.get(path, [])) == children
        prefetch.abandon()


def test_busy_reads_the_load_and_the_other_running_tasks(tmp_path):
    f = tmp_path / "loadavg"
    f.write_text("0.50 0.40 0.30 3/200 999\n")
    assert prefetch.busy(str(f)) == (0.5, 2)  # 3 running, this process among them
    f.write_text("1.25 0.40 0.30 1/200 999\n")
    assert prefetch.busy(str(f)) == (1.25, 0)
    f.write_text("garbage\n")  # unreadable: the load average alone, no task counted
    assert prefetch.busy(str(f))[1] == 0 and prefetch.busy(str(tmp_path / "absent"))[1] == 0


def test_halves_past_the_series_cap_read_whole_and_leave_the_first_unchanged(tmp_path, monkeypatch):
    from fragscope.collectors.exposition_parse import merge_parts

    lines = _two_families()
    lines.insert(-1, 'vllm:num_requests_waiting{model_name="m"} 3 1700009999')  # a series of the second half only
    path = _split_file(tmp_path, "r.om", lines)
    monkeypatch.setattr(prefetch, "SPLIT_MIN_BYTES", 1)
    (a0, cut), (_, end) = prefetch.cut_in_halves(path)
    a, _ = parse_recording(path, span=(a0, cut))
    b, _ = parse_recording(path, span=(cut, end))
    before = {k: (list(ts), list(vs)) for k, (ts, vs) in a.cols.items()}
    assert set(b.cols) - set(a.cols)  # the second half brings a series of its own
    assert merge_parts(a, b, len(a.cols), 10**9, 10**6) is None
    assert {k: (list(ts), list(vs)) for k, (ts, vs) in a.cols.items()} == before
    assert merge_parts(a, b, len(set(a.cols) | set(b.cols)), 10**9, 10**6) is a
