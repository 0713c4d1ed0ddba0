"""The artefact families of bench/eval_detectors.py (issue 13): ``batching-misconfiguration`` from a
Triton model's config.pbtxt and /metrics scrapes, ``cpu-fallback`` from ONNX Runtime profiles and
VERBOSE placement logs.

Unlike the window families, these cases come from ``fragscope.scenarios.triton`` / ``.ort``: a
discrete-event model of Triton's dynamic batcher and a generated ORT graph, written after the two
detectors and from the engines' documented mechanisms, not from the detectors' rules. Each case
randomises what the mechanism leaves free (seed, severity, scrape interval and span, uptime, jitter;
profile runs and graph size) and is read by the real readers (config.pbtxt text, /metrics text, the
profile as JSON text, the log as lines). A Triton hit needs the finding *and* the expected problem
(the knob it names); a different problem counts as ``problem:X``. Confounders must stay quiet
(``ort-cpu-only`` must be inconclusive: no GPU partition; any other inconclusive is listed as a failure).
"""
from __future__ import annotations

import collections
import json

import numpy as np

from fragscope.collectors.ort_profile import parse_events, parse_verbose_log
from fragscope.collectors.triton_config import read_config
from fragscope.detectors import batching, cpu_fallback
from fragscope.model import Inconclusive
from fragscope.scenarios import (ORT_CONFOUNDERS, ORT_PATHOLOGIES, TRITON_CONFOUNDERS, TRITON_PATHOLOGIES,
                                 OrtScenario, TritonScenario, ort_case, triton_case)

SEVERITIES = (0.3, 0.6, 1.0, 1.5, 2.0)
# Triton: the scrapes over the interval (rates), and the last scrape alone (lifetime totals since the server
# started: no arrival rate, no instance utilisation); ORT: the profile, and the verbose placement log
VIEWS = ("scrapes", "one scrape", "profile", "log")
FAMILIES = ([(k, "batching-misconfiguration") for k in TRITON_PATHOLOGIES] +
            [(k, None) for k in TRITON_CONFOUNDERS] +
            [(k, "cpu-fallback") for k in ORT_PATHOLOGIES] + [(k, None) for k in ORT_CONFOUNDERS])


def judge(kind: str, seed: int, sev: float) -> list[tuple[str, object, dict, object]]:
    """[(view, findings or Inconclusive, params, truth)] for one case: Triton scrapes, or an ORT profile and its
    log."""
    rng = np.random.default_rng(seed)
    if kind.startswith("triton-"):
        step = float(rng.choice([5.0, 10.0, 15.0, 30.0]))
        p = dict(severity=sev, step_s=step, duration_s=step * int(rng.integers(2, 7)),
                 uptime_s=round(float(rng.uniform(0, 60)), 1), noise=round(float(rng.uniform(0.5, 2.0)), 2))
        case = triton_case(TritonScenario(kind, seed=seed, **p))
        cfg = read_config(case.config_pbtxt)
        p["problem"] = case.truth.figures["problem"]
        out = []
        for view in ("scrapes", "one scrape"):
            w = case.to_window(last_only=view == "one scrape")
            out.append((view, batching.detect(cfg, batching.model_counters(w, case.model)), p, case.truth))
        return out
    p = dict(severity=sev, runs=int(rng.integers(3, 10)), gpu_nodes=int(rng.integers(8, 61)),
             noise=round(float(rng.uniform(0.5, 2.0)), 2))
    case = ort_case(OrtScenario(kind, seed=seed, **p))
    prof = parse_events(json.loads(json.dumps(case.events)))
    return [("profile", cpu_fallback.detect(prof), p, case.truth),
            ("log", cpu_fallback.detect_placement(parse_verbose_log(case.verbose_log)), p, case.truth)]


def run(per: int, seed: int, only: str | None = None) -> tuple[dict, dict, list]:
    rows: dict = {}
    sweep: dict = collections.defaultdict(lambda: [0, 0])
    fails: list = []
    ss = np.random.SeedSequence([seed, 13])
    for fam, expect in FAMILIES:
        seeds = ss.spawn(1)[0].generate_state(per)
        if only and fam != only:
            continue
        for i in range(per):
            sev = SEVERITIES[i % len(SEVERITIES)] if expect else 1.0
            for view, res, p, truth in judge(fam, int(seeds[i]), sev):
                r = rows.setdefault((fam, view), dict(n=0, hit=0, inconcl=0, sev=collections.Counter(),
                                                      fp=collections.Counter(), fp_warn=0))
                r["n"] += 1
                found = [] if isinstance(res, Inconclusive) else res
                r["inconcl"] += isinstance(res, Inconclusive)
                want = p.get("problem")
                hit = bool(expect and found and (want is None or found[0].context.get("problem") == want))
                if hit:
                    r["hit"] += 1
                    r["sev"][found[0].severity.value] += 1
                elif found:
                    tag = f"problem:{found[0].context.get('problem')}" if expect else found[0].id
                    r["fp"][tag] += 1
                    r["fp_warn"] += found[0].severity.rank >= 1 and not expect
                if expect:
                    sw = sweep[(fam, view, sev)]
                    sw[0] += hit
                    sw[1] += 1
                inc_ok = isinstance(res, Inconclusive) and res.id in truth.inconclusive
                if hit != bool(expect) or (not expect and found) or (isinstance(res, Inconclusive) and not inc_ok):
                    why = res.reason if isinstance(res, Inconclusive) else \
                        "; ".join(f"{f.severity.value}: {f.summary[:200]}" for f in found) or "nothing"
                    fails.append((fam, view, int(seeds[i]), p, why))
    return rows, sweep, fails


def report(per: int, seed: int, only: str | None = None) -> None:
    rows, sweep, fails = run(per, seed, only)
    if not rows:
        return
    print("artefact families (Triton config + scrapes, ONNX Runtime profile / verbose log; fragscope.scenarios)")
    hdr = f"{'family':40s} {'expect':26s} {'n':>3s} {'hit':>4s} {'info':>4s} {'warn':>4s} {'crit':>4s} " \
          f"{'incl':>4s} {'FP':>3s} {'FP>=w':>5s}  other"
    print(hdr)
    print("-" * len(hdr))
    for fam, expect in FAMILIES:
        for view in VIEWS:
            r = rows.get((fam, view))
            if r is None:
                continue
            other = ", ".join(f"{k}:{v}" for k, v in sorted(r["fp"].items(), key=lambda x: -x[1])) or "-"
            fp = 0 if expect else sum(r["fp"].values())
            hit = f"{r['hit']:>4d}" if expect else "   -"
            print(f"{fam + ' [' + view + ']':40s} {str(expect or '(nothing)'):26s} {r['n']:>3d} {hit} "
                  f"{r['sev']['info']:>4d} {r['sev']['warning']:>4d} {r['sev']['critical']:>4d} {r['inconcl']:>4d} "
                  f"{fp:>3d} {r['fp_warn']:>5d}  {other}")
    print()
    print("severity sweep (hit/n by severity: " + ", ".join(map(str, SEVERITIES)) + ")")
    for fam, expect in FAMILIES:
        if not expect:
            continue
        for view in VIEWS:
            cells = [f"{s}={sweep[(fam, view, s)][0]}/{sweep[(fam, view, s)][1]}" for s in SEVERITIES
                     if sweep[(fam, view, s)][1]]
            if cells:
                print(f"  {fam + ' [' + view + ']':40s} " + "  ".join(cells))
    print()
    print(f"artefact cases not as expected ({len(fails)}):")
    for fam, view, sd, p, why in fails:
        ps = " ".join(f"{k}={v}" for k, v in p.items())
        print(f"- {fam} [{view}] seed={sd} {ps}\n    {why[:300]}")
    print()
