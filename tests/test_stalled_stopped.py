"""engine-stalled on a stopped engine process: the process collector's state (T/t) from /proc/PID/stat of a
real child process stopped with SIGSTOP, and the detector on hand-built windows (5 s samples) whose figures
are worked out below each case."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import pytest

from fragscope.collectors.process import ProcessCollector, read_pid_stat_state
from fragscope.detectors import stalled
from fragscope.detectors.frame import build_frame
from fragscope.model import SeriesKey, Severity, Window, make_labels
from fragscope.pipeline import diagnose

T0 = 1_767_225_600.0
ENG = make_labels({"model_name": "m", "engine": "0"})
CORE = make_labels({"pid": "4242", "name": "VLLM::EngineCore"})
API = make_labels({"pid": "4200", "name": "vllm"})
N, STEP = 25, 5.0  # 25 samples 5 s apart: the window ends at T0 + 120 s


def _window(series: dict, n: int = N) -> Window:
    """series: (name, labels) -> values per sample (NaN: no sample then)."""
    ts = T0 + STEP * np.arange(n)
    cols, types = {}, {}
    for (name, labels), vals in series.items():
        v = np.asarray(vals, dtype=float)
        keep = np.isfinite(v)
        cols[SeriesKey(name, labels)] = (ts[keep], v[keep])
        types[name] = "counter" if name.endswith("_total") else "gauge"
    return Window.from_columns(cols, source="test", types=types)


def _serving(running=0.0, tokens_stop=None):
    """vLLM's gauges and counters; ``running=0``: the engine idle (its gauges frozen at 0 when the core stops)."""
    stop = tokens_stop if tokens_stop is not None else N
    return {("vllm:num_requests_running", ENG): [running] * N,
            ("vllm:num_requests_waiting", ENG): [0.0] * N,
            ("vllm:generation_tokens_total", ENG): [500.0 * min(i, stop) for i in range(N)],
            ("fragscope_process_cpu_seconds_total", API): [0.5 * i for i in range(N)]}


def _state(stopped_from: int, until: int = N, n_seen: int = N, labels=CORE):
    """The core's stopped gauge: 1 from sample ``stopped_from`` up to ``until`` (exclusive), samples up to ``n_seen``."""
    return {("fragscope_process_stopped_processes", labels):
            [(1.0 if stopped_from <= i < until else 0.0) if i < n_seen else np.nan for i in range(N)],
            ("fragscope_process_stopped_processes", API): [0.0] * N}


def test_stopped_in_two_samples_5s_apart_fires_with_the_idle_gauges():
    # samples 23 and 24 (T0 + 115 s, T0 + 120 s) read T: stopped 5 s = stopped_s, 2 samples = stopped_samples.
    # The engine idle (0 running): the token stall alone would say nothing
    f = build_frame(_window({**_serving(), **_state(23)}))
    assert f.engine["process_stopped_processes"][-1] == 1.0  # the engine-wide sum: one process of two
    (fnd,) = stalled.detect(f)
    assert fnd.severity is Severity.CRITICAL and fnd.context["kind"] == "stopped"
    assert fnd.context["stalled_seconds"] == pytest.approx(5.0) and fnd.onset == pytest.approx(T0 + 115.0)
    assert fnd.context["pids"] == ["4242"]
    assert "pid 4242 (VLLM::EngineCore)" in fnd.summary and "0 running" in fnd.summary
    (ev,) = [e for e in fnd.evidence if e.signal == "process_stopped_processes"]
    assert ev.observed == 1.0 and "all 2 samples over 5 s" in ev.note and "SIGSTOP" in ev.note
    # without the process state the same window is an idle engine: nothing
    assert stalled.detect(build_frame(_window(_serving()))) == []


def test_one_stopped_sample_or_a_resumed_process_does_not_fire():
    assert stalled.detect(build_frame(_window({**_serving(), **_state(24)}))) == []  # one sample: 0 s
    # stopped at samples 10-20 (50 s), running again at 21-24: cleared
    assert stalled.detect(build_frame(_window({**_serving(), **_state(10, until=21)}))) == []
    # stopped from sample 10 but no sample after 18 (the process went away: 30 s before the end, stale)
    assert stalled.detect(build_frame(_window({**_serving(), **_state(10, n_seen=19)}))) == []


def test_a_long_stop_reads_its_duration_and_names_the_resume_action():
    # stopped from sample 4 (T0 + 20 s) to the end (T0 + 120 s): 100 s, 21 samples; 8 requests were running and
    # the tokens stopped with it: the stop is the finding (not the token stall's "host" kind)
    w = _window({**_serving(running=8.0, tokens_stop=4), **_state(4)})
    (fnd,) = stalled.detect(build_frame(w))
    assert fnd.context["kind"] == "stopped" and fnd.context["stalled_seconds"] == pytest.approx(100.0)
    assert "all 21 samples over 100 s" in fnd.evidence[0].note and "8 running" in fnd.summary
    (got,) = [x for x in diagnose(w).findings if x.id == "engine-stalled"]
    acts = " ".join(got.playbook["actions"])
    assert "kill -CONT 4242" in acts and "TracerPid" in acts and "py-spy dump" in acts


def test_without_a_stopped_process_the_token_stall_is_unchanged():
    # the existing case: 8 running, tokens stop at sample 18 (30 s before the end), CPU idle -> a host-side hang
    base = _serving(running=8.0, tokens_stop=18)
    base[("fragscope_process_cpu_seconds_total", API)] = [0.5 * min(i, 18) for i in range(N)]
    (a,) = stalled.detect(build_frame(_window(base)))
    (b,) = stalled.detect(build_frame(_window({**base, **_state(N)})))  # the state read, never stopped
    assert a.context["kind"] == b.context["kind"] == "host" and a.summary == b.summary
    assert a.context["stalled_seconds"] == pytest.approx(30.0) and a.severity is Severity.WARNING


# --- the collector on real processes ---------------------------------------------------------------------
def _stopped_value(c: ProcessCollector, pid: int) -> float | None:
    for s in c.collect(time.time()).samples:
        if s.name == "fragscope_process_stopped_processes" and dict(s.labels)["pid"] == str(pid):
            return s.value
    return None


def _wait_for(c, pid, want, tries=50):
    got = None
    for _ in range(tries):  # bounded: the kernel applies SIGSTOP/SIGCONT within microseconds
        got = _stopped_value(c, pid)
        if got == want:
            return got
        time.sleep(0.1)
    return got


def test_collector_reads_state_T_of_a_child_stopped_with_sigstop():
    child = subprocess.Popen(["sleep", "60"])
    try:
        c = ProcessCollector(pids=[child.pid])
        assert _wait_for(c, child.pid, 0.0) == 0.0  # sleeping: S
        os.kill(child.pid, signal.SIGSTOP)
        assert _wait_for(c, child.pid, 1.0) == 1.0
        assert read_pid_stat_state(child.pid)[3] == "T"
        names = {dict(s.labels).get("name") for s in c.collect(time.time()).samples
                 if s.name == "fragscope_process_stopped_processes"}
        assert names == {"sleep"}
        os.kill(child.pid, signal.SIGCONT)
        assert _wait_for(c, child.pid, 0.0) == 0.0
    finally:
        child.kill()
        child.wait(timeout=10)


@pytest.mark.parametrize("state, want", [("D", 0.0), ("Z", 0.0), ("R", 0.0), ("T", 1.0), ("t", 1.0)])
def test_collector_counts_only_T_and_t_as_stopped(tmp_path, state, want):
    """This process's own /proc/PID/stat and statm copied with the state letter (field 3) replaced: D (a disk
    wait) and Z are not stopped. The command name may hold spaces and ')': the state follows the last ')'."""
    pid = os.getpid()
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    cut = stat.rindex(b")") + 2
    d = tmp_path / str(pid)
    d.mkdir()
    (d / "stat").write_bytes(stat[:cut] + state.encode() + stat[cut + 1:])
    with open(f"/proc/{pid}/statm", "rb") as fh:
        (d / "statm").write_bytes(fh.read())
    assert read_pid_stat_state(pid, str(tmp_path))[3] == state
    c = ProcessCollector(pids=[pid], proc_root=str(tmp_path))
    assert _stopped_value(c, pid) == want


def test_unreadable_proc_is_not_zero(tmp_path):
    """No stat file for the pid (another pid namespace, /proc hidden): no sample, and the signal is reported
    missing, not 0 stopped."""
    c = ProcessCollector(pids=[os.getpid()], proc_root=str(tmp_path))
    r = c.collect(time.time())
    assert not [s for s in r.samples if s.name == "fragscope_process_stopped_processes"]
    assert any(m.name == "fragscope_process_stopped_processes" for m in r.missing)
