"""The exposition line parser (fragscope.collectors.exposition_parse.parse_lines) against a baseline copy of it.

    python bench/bench_parse_lines.py --baseline OTHER_TREE/fragscope/collectors/exposition_parse.py [--repeat 5] [--turns 6]

Three inputs, built from one generated pod (fragscope.scenarios, every signal, 2 GPUs):
  recording   OpenMetrics with timestamps, 2 h at 15 s: nearly every line takes the fast path
  live        the pod's last scrape without timestamps, parsed as a live scrape is (a default time and a
              key cache kept between scrapes, as the collectors keep it): the full per-line path
  pastes      three scrapes one after the other, wrapped at 80 columns (a paste from a terminal)
Both parsers run on the same input in alternating turns, best of all their parses in CPU time (the
thread's, so other processes on a shared machine count less); printed: the times, per line, and the
ratio of this tree's parser to the baseline's, with the load average before and after (the machine may be
shared: compare the figures of one run). The baseline is any copy of the module (e.g. from
``git worktree add /tmp/before main``); it is loaded inside this tree's package so its imports resolve here.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import io
import os
import sys
import textwrap
import time

from fragscope.collectors import exposition_parse as current
from fragscope.scenarios import Scenario, write_openmetrics


def load_baseline(path: str):
    spec = importlib.util.spec_from_file_location("fragscope.collectors._baseline_exposition_parse", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def inputs() -> dict[str, tuple[list[str], dict]]:
    buf = io.StringIO()
    write_openmetrics(Scenario("healthy", duration_s=2 * 3600, gpus=2, seed=7), buf)
    rec = buf.getvalue().splitlines(True)
    # the last scrape: each series' last line, its timestamp dropped
    last: dict[str, str] = {}
    order: list[str] = []
    for ln in rec:
        if ln.startswith("#"):
            if ln.startswith(("# TYPE", "# HELP")) and ln not in last:
                last[ln] = ln
                order.append(ln)
            continue
        head, value, _ts = ln.rsplit(None, 2)
        if head not in last:
            order.append(head)
        last[head] = f"{head} {value}\n"
    page = [last[k] for k in order]
    wrapped = [w + "\n" for ln in page * 3 for w in (textwrap.wrap(ln.rstrip("\n"), 80, break_long_words=True,
                                                                  break_on_hyphens=False) or [""])]
    return {"recording": (rec, {}), "live": (page, {"default_ts": 1767225600.0}),
            "pastes": (wrapped, {"scrapes": True})}


def best(mod, lines: list[str], kw: dict, repeat: int) -> tuple[float, int]:
    cache: dict = {}
    if "default_ts" in kw:
        mod.parse_lines(lines, key_cache=cache, **kw)  # the collector's second scrape onwards
    t_best = float("inf")
    n = 0
    for _ in range(repeat):
        gc.collect()
        gc.disable()  # the previous result's release and the collector stay out of the timed span
        try:
            t = time.thread_time()
            p = mod.parse_lines(lines, key_cache=cache if "default_ts" in kw else None, **kw)
            t_best = min(t_best, time.thread_time() - t)
        finally:
            gc.enable()
        n = p.samples
        del p
    return t_best, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="a copy of fragscope/collectors/exposition_parse.py")
    ap.add_argument("--repeat", type=int, default=5, help="parses per turn (best of)")
    ap.add_argument("--turns", type=int, default=6, help="turns of both parsers, alternating which goes first")
    a = ap.parse_args()
    base = load_baseline(a.baseline)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'input':<10} {'lines':>7} {'baseline ms':>12} {'this ms':>9} {'ns/line':>8} {'this/baseline':>14}")
    for name, (lines, kw) in inputs().items():
        tb = tc = float("inf")
        for turn in range(a.turns):  # in turns, each first in every other, so a burst of load hits both
            order = (base, current) if turn % 2 == 0 else (current, base)
            for mod in order:
                t, n = best(mod, lines, kw, a.repeat)
                if mod is base:
                    tb, nb = min(tb, t), n
                else:
                    tc, nc = min(tc, t), n
        assert nb == nc, (name, nb, nc)
        print(f"{name:<10} {len(lines):>7} {tb * 1e3:>12.2f} {tc * 1e3:>9.2f} {tc / len(lines) * 1e9:>8.0f} "
              f"{tc / tb:>14.3f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
