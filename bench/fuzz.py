"""Long fuzzing runs over the four ``diagnose`` readers (the harness: tests/fuzz/harness.py).

Prints, per reader: inputs tried, exit codes, crashes, hangs, peak RSS, time per MB of input, and each
breach class with its count and smallest input (saved under tests/fuzz/repro/ with --save-repros).

    python bench/fuzz.py --reader snapshot --n 5000 --seed 1
    python bench/fuzz.py --reader all --n 2000 --subprocess-every 20 --mem 4GiB --save-repros
    python bench/fuzz.py --entrypoints [--scales 1,4,16] [--only ort]

``--entrypoints`` runs every hostile case of tests/fuzz/entrypoints.py (each entry point: scrape,
triton-batching, ort-profile, size, kv-budget, logs, --html) as a real process under RLIMIT_AS, and the
cases whose input size matters at each of ``--scales``: time, peak RSS and the ratio 16x / 4x (linear: <= 4).

In-process runs (the default) are bounded by a SIGALRM timer (--timeout); every --subprocess-every-th
input also runs as a real process under RLIMIT_AS (--mem) and --sub-timeout, and the peak RSS is the
largest of those children (in-process runs report this process's peak instead). Figures: docs/fuzzing.md.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))

import harness  # noqa: E402


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reader", default="all", choices=[*harness.READERS, "all"])
    ap.add_argument("--n", type=int, default=500, help="inputs per reader")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per in-process run (a hang beyond)")
    ap.add_argument("--subprocess-every", type=int, default=0, help="every K-th input also as a subprocess")
    ap.add_argument("--sub-timeout", type=float, default=30.0)
    ap.add_argument("--mem", default="4GiB", help="RLIMIT_AS of subprocess runs")
    ap.add_argument("--self-mem", default="6GiB", help="address space in-process runs may add to this process")
    ap.add_argument("--bomb-mib", type=float, default=harness.BOMB_MIB, help="unpacked size of gzip bombs (MiB)")
    ap.add_argument("--save-repros", action="store_true", help="write each class's smallest input to tests/fuzz/repro/")
    ap.add_argument("--minimize", type=int, default=150, metavar="RUNS",
                    help="with --save-repros: shrink each class's input in at most RUNS runs (0: keep the smallest seen)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--entrypoints", action="store_true", help="the hostile cases of every entry point, with scaling")
    ap.add_argument("--scales", default="1,4,16")
    ap.add_argument("--only", default="", help="with --entrypoints: cases whose name holds this text")
    a = ap.parse_args()
    if a.entrypoints:
        sys.exit(entrypoints(a))
    harness.BOMB_MIB = a.bomb_mib
    readers = harness.READERS if a.reader == "all" else (a.reader,)
    import fragscope

    print(f"fragscope from {os.path.dirname(os.path.dirname(fragscope.__file__))}; seed {a.seed}; "
          f"{a.n} inputs per reader; in-process timeout {a.timeout:g} s; subprocess every "
          f"{a.subprocess_every or 'never'} (RLIMIT_AS {a.mem}, timeout {a.sub_timeout:g} s)")
    total_breaches = 0
    for r in readers:
        t0 = time.perf_counter()

        def progress(i, fi, o, r=r):
            if a.verbose and (o.hang or harness.judge(o, fi.fmt)):
                print(f"  [{r} #{i}] {fi.seed} {'+'.join(fi.ops)} rc={o.rc} {o.signature}", flush=True)

        rep = harness.fuzz(r, a.n, a.seed, subprocess_every=a.subprocess_every, timeout_s=a.timeout,
                           sub_timeout_s=a.sub_timeout, mem_bytes=_size(a.mem), progress=progress,
                           self_mem_bytes=_size(a.self_mem))
        wall = time.perf_counter() - t0
        mb = rep.bytes_total / 1e6
        self_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        child_peak = rep.peak_rss_bytes
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(rep.exit_codes.items()))
        print(f"\n{r}: {rep.tried} inputs ({mb:.1f} MB) in {wall:.1f} s; exit codes {{{codes}}}; "
              f"crashes {rep.crashes}, hangs {rep.hangs}")
        imb = rep.inproc_bytes / 1e6
        print(f"  time per MB of input (in-process runs) {rep.inproc_seconds / imb if imb else 0:.3f} s; slowest "
              f"input {rep.slowest_seconds:.2f} s; peak RSS: {rep.subprocess_runs} subprocess runs "
              f"{(child_peak or 0) / 2**20:.0f} MiB, this process {self_peak / 2**20:.0f} MiB")
        for sig, b in sorted(rep.breaches.items(), key=lambda kv: -kv[1]["count"]):
            fi = b["input"]
            where = ""
            if a.save_repros:
                if a.minimize:
                    fi = harness.minimize(r, sig, fi, budget=a.minimize, timeout_s=a.timeout)
                where = f" -> {os.path.relpath(harness.save_repro(r, sig, fi), ROOT)} ({len(fi.data)} B)"
            print(f"  {b['count']:>5} x {sig}  (smallest: {len(fi.data)} B, {fi.seed} {'+'.join(fi.ops)}, "
                  f"--format {fi.fmt}){where}")
            last = (b["outcome"].stderr.strip().splitlines() or [""])[-1]
            print(f"          {last[:200]}")
        total_breaches += rep.crashes + rep.hangs
    sys.exit(1 if total_breaches else 0)


def entrypoints(a) -> int:
    import tempfile
    from pathlib import Path

    import entrypoints as ep

    scales = [int(x) for x in a.scales.split(",")]
    bad = 0
    print(f"{'case':<48} {'scale':>5} {'input MB':>9} {'exit':>4} {'seconds':>8} {'peak MiB':>8}  verdict")
    with tempfile.TemporaryDirectory(prefix="fragscope-entry-") as tmp:
        for case in ep.CASES:
            if a.only and a.only not in case.name:
                continue
            rows = []
            for k in (scales if case.scales else scales[:1]):
                d = Path(tmp) / f"{case.name}-{k}"
                d.mkdir()
                argv = case.make(d, k)
                size = sum(os.path.getsize(x) for x in argv if os.path.isfile(x))
                fmt = "human" if "--html" in argv else "json"
                o = harness.run_subprocess(argv + ([] if "--html" in argv else ["--format", fmt]),
                                           timeout_s=a.sub_timeout, mem_bytes=_size(a.mem), prog=case.prog)
                verdict = harness.judge(o, fmt) or "ok"
                bad += verdict != "ok"
                rows.append((k, o.seconds, o.peak_rss_bytes or 0))
                print(f"{case.name:<48} {k:>4}x {size / 1e6:>9.2f} {str(o.rc):>4} {o.seconds:>8.2f} "
                      f"{(o.peak_rss_bytes or 0) / 2**20:>8.0f}  {verdict}", flush=True)
            if len(rows) >= 3:
                (_, t_a, m_a), (_, t_b, m_b) = rows[-2], rows[-1]
                print(f"{'':<48} {scales[-1]}x / {scales[-2]}x: time {t_b / max(t_a, 1e-9):.2f}, "
                      f"peak {m_b / max(m_a, 1):.2f}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    main()
