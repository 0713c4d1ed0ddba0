"""Closed-loop load on a vLLM OpenAI server (127.0.0.1), bounded in time. Used by bench/e2e_vllm_cpu.sh.

    python load.py --url http://127.0.0.1:8000 --model tiny --concurrency 32 --max-tokens 512 --duration 180

Each of ``--concurrency`` workers sends one ``/v1/completions`` request at a time (``ignore_eos``: exactly
``--max-tokens`` tokens each), then the next, until ``--duration`` seconds have passed. Requests still in
flight ``--grace`` seconds after that are abandoned (the connection closes and vLLM aborts them). Prints
one JSON line with counts and latencies; exits 1 if no request succeeded.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request

WORDS = ("the kv cache block memory server request token prompt model batch queue preempt allocator "
         "latency throughput engine scheduler sequence decode prefill attention").split()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--prompt-words", type=int, default=16)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--grace", type=float, default=30.0)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds a worker waits between requests")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (seconds)")
    a = ap.parse_args(argv)

    url = a.url.rstrip("/") + "/v1/completions"
    t0 = time.monotonic()
    deadline = t0 + a.duration
    lock = threading.Lock()
    lat: list[float] = []
    stats = {"ok": 0, "failed": 0, "completion_tokens": 0, "prompt_tokens": 0, "errors": {}}

    def worker(i: int) -> None:
        rnd = random.Random(i)
        while time.monotonic() < deadline:
            prompt = " ".join(rnd.choice(WORDS) for _ in range(a.prompt_words))
            body = json.dumps({"model": a.model, "prompt": prompt, "max_tokens": a.max_tokens,
                               "temperature": 1.0, "ignore_eos": True}).encode()
            req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            s = time.monotonic()
            try:
                with urllib.request.urlopen(req, timeout=a.timeout) as r:
                    d = json.load(r)
                u = d.get("usage") or {}
                with lock:
                    stats["ok"] += 1
                    stats["completion_tokens"] += int(u.get("completion_tokens") or 0)
                    stats["prompt_tokens"] += int(u.get("prompt_tokens") or 0)
                    lat.append(time.monotonic() - s)
            except (urllib.error.URLError, OSError, ValueError) as e:
                key = type(e).__name__ + (f" {e.code}" if isinstance(e, urllib.error.HTTPError) else "")
                with lock:
                    stats["failed"] += 1
                    stats["errors"][key] = stats["errors"].get(key, 0) + 1
                time.sleep(1.0)  # a down server: do not spin
            if a.pause:
                time.sleep(a.pause)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(a.concurrency)]
    for t in threads:
        t.start()
    end_by = deadline + a.grace
    for t in threads:
        t.join(max(0.0, end_by - time.monotonic()))
    abandoned = sum(t.is_alive() for t in threads)
    wall = time.monotonic() - t0
    lat.sort()

    def q(p: float):
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None
    out = {"concurrency": a.concurrency, "max_tokens": a.max_tokens, "wall_seconds": round(wall, 1), **stats,
           "abandoned_in_flight": abandoned, "latency_p50_seconds": q(0.5), "latency_p99_seconds": q(0.99),
           "completion_tokens_per_second": round(stats["completion_tokens"] / wall, 1) if wall else None}
    print(json.dumps(out), flush=True)
    return 0 if stats["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
