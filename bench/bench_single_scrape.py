"""Single scrapes: fragscope beside vllm-doctor on the same /metrics pages, served over HTTP (issue 10).

    python bench/bench_single_scrape.py [--per-family 6] [--seed 7] [--doctor /path/to/venv/bin/vllm-doctor]

Incidents come from the independent synthesizer of bench/eval_detectors.py (not fragscope.scenarios).
For every case the *last scrape* of the pod (what one `curl /metrics` at incident time holds: no
timestamps, lifetime counters) is rendered as Prometheus text and served on 127.0.0.1. Both tools read
that URL once: `vllm-doctor diagnose URL -o json` (PyPI vllm-doctor, run from its own venv: it pins
other versions of shared dependencies) and fragscope (the same page parsed and diagnosed in process).

A case is right when the expected diagnosis is reported (pathologies) or nothing at warning or above is
(confounders; fragscope's info-level "at capacity" note and any vllm-doctor rule that fires count as alarms
for vllm-doctor only where they fire, since it has no severity below its rules). vllm-doctor's rule ids are mapped onto fragscope's: kv_cache_pressure and
preemption_pressure -> kv-cache-pressure, queue_pressure and queue_latency -> capacity-saturation; it has
no rule for the allocator, clocks, leaks, launch gaps or block size (vLLM's /metrics alone cannot show
them), which the table shows as "no rule". Both scores are printed from one run.
"""
from __future__ import annotations

import argparse
import collections
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eval_detectors as E  # noqa: E402  (the independent synthesizer)

from fragscope.collectors.exposition import parse_text  # noqa: E402
from fragscope.pipeline import diagnose  # noqa: E402

DOCTOR_MAP = {"kv_cache_pressure": "kv-cache-pressure", "preemption_pressure": "kv-cache-pressure",
              "queue_pressure": "capacity-saturation", "queue_latency": "capacity-saturation"}
DOCTOR_CAN = set(DOCTOR_MAP.values())


def render_last_scrape(w) -> str:
    """The last sample of every series as Prometheus text without timestamps (what curl saves)."""
    fams: dict[str, list[str]] = collections.defaultdict(list)
    types: dict[str, str] = {}
    for k, s in w.series.items():
        if not len(s):
            continue
        base = k.name
        for suf in ("_bucket", "_sum", "_count"):
            if s.type in ("histogram", "summary") and base.endswith(suf):
                base = base[: -len(suf)]
        types.setdefault(base, s.type if s.type in ("counter", "gauge", "histogram", "summary") else "untyped")
        lab = ",".join(f'{n}="{v}"' for n, v in k.labels)
        v = float(s.values[-1])
        fams[base].append(f"{k.name}{{{lab}}} {v!r}" if lab else f"{k.name} {v!r}")
    out = []
    for base in sorted(fams):
        out.append(f"# TYPE {base} {types[base]}")
        out.extend(sorted(fams[base]))
    return "\n".join(out) + "\n"


class Pages(http.server.BaseHTTPRequestHandler):
    pages: dict[str, bytes] = {}

    def do_GET(self):  # noqa: N802
        body = self.pages.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def fragscope_ids(url: str) -> tuple[set[str], set[str]]:
    """(every id reported, ids reported at warning or above)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    w = parse_text(text, default_ts=time.time(), source=url).to_window(url)
    rep = diagnose(w)
    return {f.id for f in rep.findings}, {f.id for f in rep.findings if f.severity.rank >= 1}


def doctor_ids(doctor: str, url: str) -> set[str] | None:
    p = subprocess.run([doctor, "diagnose", url, "-o", "json"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "NO_COLOR": "1"}, cwd=os.environ.get("TMPDIR", "/tmp"))
    try:
        d = json.loads(p.stdout)
    except json.JSONDecodeError:
        return None
    fired = set()
    for c in d.get("checks", []) or []:  # schema 1: one entry per rule, "finding" null when it did not fire
        if c.get("finding"):
            fired.add(DOCTOR_MAP.get(c["id"], "doctor:" + c["id"]))
    return fired


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=6)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--doctor", default=shutil.which("vllm-doctor") or "/tmp/vdenv/bin/vllm-doctor",
                    help="vllm-doctor executable (pip install vllm-doctor into its own venv)")
    a = ap.parse_args()
    if not os.path.exists(a.doctor):
        print(f"vllm-doctor not found at {a.doctor}: python -m venv /tmp/vdenv && /tmp/vdenv/bin/pip install "
              "vllm-doctor", file=sys.stderr)
        return 2
    import numpy as np

    ss = np.random.SeedSequence(a.seed)
    cases = []
    for fam, exp, timings, grp in E.FAMILIES:
        if grp in ("debatable", "missing-primary"):
            continue
        seeds = ss.spawn(1)[0].generate_state(a.per_family)
        for i in range(a.per_family):
            c = E.Case(fam, exp, int(seeds[i]), timings[i % len(timings)], grp)
            if c.timing == "restart":
                continue  # the incident ended before the scrape
            cases.append(c)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    rows = collections.defaultdict(lambda: {"n": 0, "frag": 0, "doc": 0, "doc_rule": True})
    t0 = time.perf_counter()
    for i, c in enumerate(cases):
        E.run_case(c, True)
        Pages.pages[f"/c{i}/metrics"] = render_last_scrape(c.window).encode()
        c.window = None
        url = f"{base}/c{i}/metrics"
        fr, fr_warn = fragscope_ids(url)
        dr = doctor_ids(a.doctor, url)
        r = rows[c.family]
        r["n"] += 1
        if c.expect:
            r["frag"] += c.expect in fr
            r["doc"] += dr is not None and c.expect in dr
            r["doc_rule"] = c.expect in DOCTOR_CAN
        else:
            r["frag"] += not fr_warn
            r["doc"] += dr is not None and not dr
    srv.shutdown()
    print(f"single scrapes (last scrape of each incident, no timestamps), {len(cases)} cases, seed {a.seed}, "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"{'family':26s} {'expect':24s} {'n':>3s} {'fragscope':>9s} {'vllm-doctor':>11s}")
    tot = [0, 0, 0]
    for fam, exp, _, grp in E.FAMILIES:
        if fam not in rows:
            continue
        r = rows[fam]
        doc = f"{r['doc']}/{r['n']}" + ("" if r["doc_rule"] else " (no rule)")
        print(f"{fam:26s} {str(exp or '(nothing)'):24s} {r['n']:>3d} {r['frag']:>5d}/{r['n']:<3d} {doc:>11s}")
        tot[0] += r["n"]
        tot[1] += r["frag"]
        tot[2] += r["doc"]
    print(f"{'right':26s} {'':24s} {tot[0]:>3d} {tot[1]:>5d}/{tot[0]:<3d} {tot[2]:>5d}/{tot[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
