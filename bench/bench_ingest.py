"""Ingest + diagnose an 8-hour, 15 s recording against promtool's backfill of the same file.

    python bench/bench_ingest.py [--repeat 3] [--kind allocator-fragmentation] [--keep DIR]

Prints, for one generated OpenMetrics file with every signal (~165k lines, ~19 MB):
  fragscope   read_recording + playbooks.diagnose (detectors + playbooks) (best of --repeat)
  promtool    tsdb create-blocks-from openmetrics FILE DIR (Debian package prometheus; skipped if absent)
  prometheus_client text_string_to_metric_families on the Prometheus-text twin of the file (ms timestamps;
              its OpenMetrics parser rejects multi-point histograms, so it gets the text format)
and the ratios. Target: fragscope no slower than promtool.
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


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kind", default="allocator-fragmentation")
    ap.add_argument("--keep", help="write the recordings here instead of a temporary directory")
    a = ap.parse_args()
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
        def backfill():
            out = os.path.join(work, "tsdb")
            shutil.rmtree(out, ignore_errors=True)
            p = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", om, out],
                               capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "promtool failed")
        t_prom, _ = best_of(backfill, a.repeat)
        print(f"promtool tsdb create-blocks-from:    {t_prom:7.3f} s")
        print(f"ratio fragscope (ingest+diagnose) / promtool: {t_all / t_prom:.2f}  "
              f"({'faster' if t_all <= t_prom else 'SLOWER'} than promtool; target <= 1.0)")
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
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
