"""``diagnose trace FILE`` itself, without click: what the command does once its options are read. The click
command (trace_cmd.py) calls :func:`run_trace`; so does the console entry for a plain ``diagnose trace FILE``
(fragscope/cli/__init__.py), which reads those few options itself and leaves every other command line to click.
"""
from __future__ import annotations

import json
import os
import sys

from ..model import Report, rank_findings
from .base import echo, exit_without_teardown, fail
from ..units import json_safe
from .render import fmt_value, render_human, report_exit_code

# The options' values and defaults (the click command and the console entry read them here).
FORMAT_CHOICES = ("human", "json")
FORMAT_DEFAULT = "human"
FAIL_ON_CHOICES = ("info", "warning", "critical", "never")
FAIL_ON_DEFAULT = "critical"


def small_pages() -> None:
    """Ask numpy not to back its large arrays with transparent huge pages (numpy's own switch, also set
    by NUMPY_MADVISE_HUGEPAGE=0, which takes precedence when set). A trace of millions of ops is read
    into new arrays once and the process exits: nothing gains from huge pages' fewer TLB misses, and
    where huge pages are slow to fault in they dominate. On the 2-core development VM (THP "madvise")
    a new 16 MB array takes 44 ms with huge pages against 7 ms without; the whole `diagnose trace` on
    2 M kernels spends 0.35 s less CPU (bench/bench_trace.py)."""
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return
    if "numpy" not in sys.modules:  # numpy's import reads the variable (numpy/__init__.py), if a large trace
        os.environ["NUMPY_MADVISE_HUGEPAGE"] = "0"  # imports it: a small one is read without numpy
        return
    try:
        from numpy._core.multiarray import _set_madvise_hugepage  # numpy >= 2
    except ImportError:
        try:
            from numpy.core.multiarray import _set_madvise_hugepage  # numpy 1.x
        except ImportError:
            return
    _set_madvise_hugepage(False)


def reuse_freed_memory(path: str) -> None:
    """On glibc, keep the memory of freed arrays for the next ones when ``path`` is a large file (32 MiB
    and more: a trace of some hundred thousand ops). glibc maps each large allocation (an array of a
    million ops: 8 MB) from the kernel and unmaps it when freed, so the next array of that size is new
    pages again, each a page fault that zero-fills it. Reading and analysing a trace frees and allocates
    arrays of the same sizes over and over: with the freed memory kept (mallopt's mmap and trim thresholds,
    as the MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ variables set them), `diagnose trace` on an
    export of 2 M kernels took 86 k page faults instead of 215 k and 0.3-0.4 s of system time instead of
    0.6-0.7 s (bench/bench_trace.py). The process exits after one trace: nothing is given back meanwhile.
    A variable the user set takes precedence; elsewhere than glibc this does nothing."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return
    try:
        if os.stat(path).st_size < 32 << 20 or not sys.platform.startswith("linux"):
            return
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # (no such file: the reader says so; no mallopt: not glibc)
        return
    mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD: freed memory at the heap's top is kept
    if not mallopt(-3, 1 << 30):  # M_MMAP_THRESHOLD: from the heap up to 1 GiB (older glibc: 32 MiB at most)
        mallopt(-3, 32 << 20)


def run_trace(file, fmt: str = FORMAT_DEFAULT, fail_on: str = FAIL_ON_DEFAULT, html: str | None = None,
              max_json_bytes: int | None = None) -> int:
    """Run ``diagnose trace`` on FILE (a path, or several: the ranks of one job) and return its exit code."""
    files = (file,) if isinstance(file, str) else tuple(file)
    if len(files) > 1 or os.path.isdir(files[0]):
        from .trace_ranks import ranks_cmd

        return ranks_cmd(list(files), fmt, fail_on, html, max_json_bytes)
    file = files[0]
    small_pages()
    reuse_freed_memory(file)
    analysis, findings, report = analyse_trace(file, max_json_bytes)
    if html:
        from .render import write_trace_html
        write_trace_html(html, analysis, report)
    if fmt == "json":
        sys.stdout.write(json.dumps(trace_json(analysis, findings), indent=2, allow_nan=False) + "\n")
    else:
        _print_tables(analysis)
        render_human(report, sys.stdout)
    exit_without_teardown()  # (one file read and closed, the output written: nothing left to free first)
    return report_exit_code(report, fail_on)


def analyse_trace(file: str, max_json_bytes: int | None = None):
    """(analysis, findings, report) of a kernel timeline FILE: what ``diagnose trace`` prints."""
    from ..collectors.trace_io import DEFAULT_MAX_JSON_BYTES
    from ..trace_pipeline import analyse_trace_file

    analysis, findings, report = trace_report(
        lambda: analyse_trace_file(file, max_json_bytes=max_json_bytes or DEFAULT_MAX_JSON_BYTES), file, file)
    if findings:  # the registry of every diagnosis is imported only when a verdict needs its playbook
        from ..playbooks import attach_playbooks

        attach_playbooks(report)  # timeline verdicts leave the detector without a playbook
    return analysis, findings, report


def trace_report(analyse, source: str, first_path: str):
    """(analysis, findings, report) from ``analyse()``, a trace analysis returning (analysis, findings); its
    TraceError, or running out of memory on ``first_path``, is the command's one-line error (exit 2)."""
    from ..model import Inconclusive
    from ..timeline_model import TraceError

    try:
        analysis, findings = analyse()
    except TraceError as e:
        fail(str(e))
    except MemoryError:
        fail(f"cannot read {first_path}: out of memory")
    w = analysis["window"]
    report = Report(window=(w["start"] or float("nan"), w["end"] or float("nan")), findings=findings,
                    inconclusive=[Inconclusive(**i) for i in analysis["inconclusive"]], source=source)
    return analysis, findings, report


def trace_json(analysis: dict, findings) -> dict:
    """``diagnose trace --format json``: the analysis with the ranked findings (strict JSON values)."""
    out = dict(analysis)
    out["findings"] = [f.to_dict() for f in rank_findings(findings)]
    return json_safe(out)


def _r(v) -> str:
    return fmt_value(v, "ratio")


def _s(d: dict | None, k: str) -> str:
    return fmt_value(d.get(k) if d else None, "seconds")


def _print_tables(a: dict) -> None:
    ver = f" schema {a['schema_version']}" if a.get("schema_version") else ""
    sel = a["selection"]
    echo(f"{a['format']}{ver}: {a['source']}  span {fmt_value(a['window']['span_seconds'], 'seconds')}, "
         f"{sel['ops_analysed']} of {sel['ops_total']} GPU ops analysed ({sel['rule']})")
    hdr = (f"{'gpu':>4} {'stream':>10} {'ops':>7} {'busy':>7} {'idle':>7} {'gap p50':>8} {'gap p99':>8} "
           f"{'gap max':>8} {'host-w':>7} {'kern-w':>7} {'delay50':>8} {'short':>6}")
    echo(hdr)
    for d in a["devices"]:
        rows = [("all", d)] + [(str(s["stream"]), s) for s in d["streams"][:8]]
        for name, m in rows:
            g = m.get("gap_seconds")
            echo(f"{d['device']:>4} {name:>10} {sum(m['ops'].values()):>7} {_r(m['busy_ratio']):>7} "
                 f"{_r(m['idle_ratio']):>7} {_s(g, 'p50'):>8} {_s(g, 'p99'):>8} {_s(g, 'max'):>8} "
                 f"{_r(m['host_wait_ratio']):>7} {_r(m['kernel_wait_ratio']):>7} "
                 f"{_s(m['launch_delay_seconds'], 'p50'):>8} {_r(m['short_kernel_ratio']):>6}")
        if len(d["streams"]) > 8:
            echo(f"{'':>4} {'…':>10} {len(d['streams']) - 8} more streams (--format json)")
    h = a["host"]
    echo(f"host: {h['launch_calls']} launches ({h['driver_launch_calls']} driver, {h['graph_launch_calls']} graph), "
         f"{h['sync_api_calls']} synchronizing calls {fmt_value(h['sync_api_seconds'], 'seconds')} "
         f"({_r(h['sync_api_ratio'])}), {h['pageable_copies']} pageable copies, steady-state "
         f"{h['steady_malloc_calls']} malloc / {h['steady_free_calls']} free")
    wl = a.get("workload") or {}
    if wl:
        marks = ", ".join(f"{k} {v}" for k, v in wl.get("markers", {}).items())
        echo(f"workload: {wl.get('kind')}" + (f" ({marks})" if marks else " (no training or serving markers)"))
    um = a.get("unified_memory")
    if um and um["migrations"]:
        echo(f"unified memory: {um['migrations']} page migrations ({um['htod']} host->device, {um['dtoh']} "
             f"device->host), {um['bytes'] / 2**20:.1f} MiB, {fmt_value(um['seconds'], 'seconds')} "
             f"({_r(um['time_ratio'])} of the window)")
    for n in a.get("notes", []):
        echo(f"note: {n}")
    echo("")
