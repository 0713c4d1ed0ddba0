"""Ingest + diagnose an 8-hour, 15 s recording against promtool's backfill of the same file.

    python bench/bench_ingest.py [--repeat 3] [--kind allocator-fragmentation] [--keep DIR]
    python bench/bench_ingest.py --churn 50000 [--no-diagnose] [--before OTHER_TREE]

Prints, for one generated OpenMetrics file with every signal (~165k lines, ~19 MB):
  fragscope   read_recording + playbooks.diagnose (detectors + playbooks) (best of --repeat)
  promtool    tsdb create-blocks-from openmetrics FILE DIR (Debian package prometheus; skipped if absent)
  prometheus_client text_string_to_metric_families on the Prometheus-text twin of the file (ms timestamps;
              its OpenMetrics parser rejects multi-point histograms, so it gets the text format)
and the ratios, with the load average before and after (the machine may be shared: compare figures of one
run). Target: `diagnose FILE` (whole process) <= 0.4x promtool's backfill (whole process); the in-process
ratio is printed beside it. Whole processes run alternately, each with its CPU (user + sys, children it
waited for included): `diagnose FILE` (its file parsed in child processes while it imports, two halves of
a large plain file: fragscope/collectors/prefetch.py), the same command read in one process (no child), and
promtool.

``--churn N``: the short-lived-series case (issue 12: N series of 2 points each, one after the other over
a long span, e.g. one series per request id). Runs N and 2N series, each in a fresh process (so peak RSS
is its own), and prints read_recording and diagnose times, peak RSS, and the 2N/N ratios: about 2 means
linear, about 4 quadratic. ``--before DIR`` runs the same files first with the fragscope of another
checkout (e.g. ``git worktree add /tmp/before main``) and prints before/after ratios.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from fragscope.collectors.exposition import read_recording
from fragscope.scenarios import Scenario, write_openmetrics, write_prometheus_text


def process_times(cmd: list[str], env: dict | None) -> tuple[float, float, int, str]:
    """Wall and CPU seconds (user + sys, with the children it waited for) of one process, its exit code and
    the last line of its stderr."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, p.returncode, (err.decode(errors="replace").strip().splitlines() or [""])[-1]


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


_CHURN_CHILD = r"""
import json, resource, sys, time
from fragscope.collectors.exposition import read_recording
t = time.perf_counter()
w = read_recording(sys.argv[1])
t_read = time.perf_counter() - t
rss_read = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t_diag = None
if sys.argv[2] == "1":
    from fragscope.pipeline import diagnose
    t = time.perf_counter()
    diagnose(w)
    t_diag = time.perf_counter() - t
print(json.dumps({"read": t_read, "diag": t_diag, "series": len(w), "rss_read": rss_read,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def write_churn(path: str, n: int) -> None:
    """n series of 2 points each, 15 s apart, series i living from 15*i to 15*(i+1): a span of 15*n s."""
    t0 = 1_700_000_000
    with open(path, "w") as fh:
        fh.write("# TYPE vllm:num_requests_running gauge\n")
        for i in range(n):
            k = f'vllm:num_requests_running{{model_name="m",request_id="req-{i:08d}"}}'
            fh.write(f"{k} 1 {t0 + 15 * i}\n{k} 2 {t0 + 15 * i + 15}\n")
        fh.write("# EOF\n")


def churn(n: int, with_diagnose: bool, work: str, tree: str | None = None, label: str = "") -> list[dict] | None:
    import json

    rows = []
    env = dict(os.environ)
    env["PYTHONPATH"] = tree or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if label:
        print(f"{label} ({env['PYTHONPATH']}):")
    for size in (n, 2 * n):
        path = os.path.join(work, f"churn_{size}.om")
        if not os.path.exists(path):
            write_churn(path, size)
        p = subprocess.run([sys.executable, "-c", _CHURN_CHILD, path, "1" if with_diagnose else "0"], env=env,
                           capture_output=True, text=True, timeout=3600,
                           cwd=work)  # not this tree's directory: PYTHONPATH decides which code runs
        if p.returncode != 0:
            print(f"churn {size:,}: failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
            return None
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r["size"], r["mb"] = size, os.path.getsize(path) / 1e6
        rows.append(r)
        diag = f"{r['diag']:7.2f} s" if r["diag"] is not None else "      -"
        print(f"churn {size:>9,} series ({r['mb']:5.1f} MB): read_recording {r['read']:6.2f} s "
              f"(peak RSS {r['rss_read'] / 2**20:6.0f} MiB), diagnose {diag} (peak RSS {r['rss'] / 2**20:6.0f} MiB)")
    a, b = rows
    line = f"ratio 2N/N: read {b['read'] / a['read']:.2f}x, read RSS {b['rss_read'] / a['rss_read']:.2f}x"
    if a["diag"]:
        line += f", diagnose {b['diag'] / a['diag']:.2f}x, RSS {b['rss'] / a['rss']:.2f}x"
    print(line + "  (2 = linear, 4 = quadratic)")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kind", default="allocator-fragmentation")
    ap.add_argument("--keep", help="write the recordings here instead of a temporary directory")
    ap.add_argument("--churn", type=int, default=0, metavar="N",
                    help="instead: the short-lived-series case with N and 2N series")
    ap.add_argument("--no-diagnose", action="store_true", help="--churn: time read_recording only")
    ap.add_argument("--before", metavar="DIR", help="--churn: also run another checkout's fragscope first")
    a = ap.parse_args()
    if a.churn:
        work = a.keep or tempfile.mkdtemp(prefix="fragscope-churn-")
        os.makedirs(work, exist_ok=True)
        try:
            before = churn(a.churn, not a.no_diagnose, work, a.before, "before") if a.before else None
            after = churn(a.churn, not a.no_diagnose, work, None, "after" if a.before else "")
            if after is None:
                return 1
            if before:
                for b, c in zip(before, after):
                    line = (f"after/before at {b['size']:,} series: read {c['read'] / b['read']:.2f}x, "
                            f"peak RSS {c['rss'] / b['rss']:.2f}x")
                    if b["diag"] and c["diag"]:
                        line += f", diagnose {c['diag'] / b['diag']:.2f}x"
                    print(line)
            return 0
        finally:
            if not a.keep:
                shutil.rmtree(work, ignore_errors=True)
    work = a.keep or tempfile.mkdtemp(prefix="fragscope-bench-")
    os.makedirs(work, exist_ok=True)
    om = os.path.join(work, "recording.om")
    prom = os.path.join(work, "recording.prom")
    s = Scenario(a.kind, duration_s=8 * 3600, step_s=15, seed=0)
    t = time.perf_counter()
    write_openmetrics(s, om)
    write_prometheus_text(s, prom)
    with open(om, "rb") as fh:
        lines = sum(1 for _ in fh)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; best of {a.repeat}")
    print(f"recording: {a.kind}, 8 h at 15 s: {lines:,} lines, {os.path.getsize(om) / 1e6:.1f} MB "
          f"(generated in {time.perf_counter() - t:.2f} s) -> {om}")

    from fragscope.pipeline import diagnose

    t_read, w = best_of(lambda: read_recording(om), a.repeat)

    def ingest_and_diagnose():
        return diagnose(read_recording(om))

    try:
        t_all, report = best_of(ingest_and_diagnose, a.repeat)
        n_find = len(report.findings)
        diag_note = f"{n_find} finding(s): {', '.join(f.id for f in report.findings) or '-'}"
    except Exception as e:  # the detectors are being written; report rather than hide
        t_all, diag_note = float("nan"), f"diagnose failed: {type(e).__name__}: {e}"
    print(f"fragscope read_recording:            {t_read:7.3f} s  ({len(w)} series, "
          f"{sum(len(x) for x in w):,} points)")
    print(f"fragscope read_recording + diagnose: {t_all:7.3f} s  ({diag_note})")

    t_prom = None
    promtool = shutil.which("promtool")
    if promtool:
        def backfill_cmd() -> list[str]:
            out = os.path.join(work, "tsdb")
            shutil.rmtree(out, ignore_errors=True)
            return [promtool, "tsdb", "create-blocks-from", "openmetrics", om, out]
        # Whole processes, alternately (the machine's load moves): `diagnose FILE` as a user runs it (a
        # fresh interpreter: start-up, imports, read, detectors, playbooks, JSON out, exit) against promtool.
        # fragscope with compiled bytecode, as installed (bench/benchproc.py). CPU: user + sys of the process
        # and the children it waited for (diagnose FILE's read in a child: collectors/prefetch.py; promtool's
        # threads). "one process": the same command with the file read in the process itself (the console
        # entry with lane=False: every command line through click, no child).
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from benchproc import DIAGNOSE, installed_env

        env = installed_env(os.path.join(work, "pycache"))
        args = [om, "--format", "json", "--fail-on", "never"]
        one = [sys.executable, "-c", "from fragscope.cli import diagnose_main; diagnose_main(lane=False)"]
        runs = {"diagnose": (DIAGNOSE + args, env), "one": (one + args, env), "promtool": (None, None)}
        best = {k: [float("inf"), float("inf")] for k in runs}
        status = "ok"
        for _ in range(a.repeat):
            for k, (cmd, e) in runs.items():
                wall, cpu, rc, err = process_times(cmd or backfill_cmd(), e)
                if rc not in ((0,) if k == "promtool" else (0, 1)):
                    if k == "promtool":
                        raise RuntimeError(err or "promtool failed")
                    status = f"rc={rc} {err[:80]}"
                best[k] = [min(best[k][0], wall), min(best[k][1], cpu)]
        (t_prom, c_prom), (t_whole, c_whole), (t_one, c_one) = best["promtool"], best["diagnose"], best["one"]
        print(f"promtool tsdb create-blocks-from:    {t_prom:7.3f} s  (whole process; CPU {c_prom:.3f} s)")
        print(f"diagnose FILE --format json:         {t_whole:7.3f} s  (whole process; CPU {c_whole:.3f} s, "
              f"its read's children included) [{status}]")
        print(f"  the same, read in one process:     {t_one:7.3f} s  (CPU {c_one:.3f} s)")
        print(f"ratio fragscope (ingest+diagnose) / promtool, in-process: {t_all / t_prom:.2f}  "
              f"({'faster' if t_all <= t_prom else 'SLOWER'} than promtool)")
        print(f"ratio diagnose FILE / promtool, whole processes: {t_whole / t_prom:.2f}  "
              f"(target <= 0.4: {'met' if t_whole <= 0.4 * t_prom else 'not met'}); CPU {c_whole / c_prom:.2f}; "
              f"read in one process {t_one / t_prom:.2f}")
        floor, _ = best_of(lambda: subprocess.run([sys.executable, "-c", "import numpy"], check=True), a.repeat)
        print(f"floor: python -c 'import numpy':      {floor:7.3f} s")
    else:
        print("promtool: not installed (apt-get install prometheus); ratio not measured")

    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        print("prometheus_client: not installed; second baseline skipped")
    else:
        def pc_parse():
            with open(prom, encoding="utf-8") as fh:
                text = fh.read()
            return sum(len(f.samples) for f in text_string_to_metric_families(text))
        try:
            t_pc, n = best_of(pc_parse, 1)
            print(f"prometheus_client text parser:       {t_pc:7.3f} s  ({n:,} samples, text format twin)")
            print(f"ratio prometheus_client / fragscope read_recording: {t_pc / t_read:.1f}x")
        except Exception as e:
            print(f"prometheus_client text parser: cannot read it ({type(e).__name__}: {e})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
