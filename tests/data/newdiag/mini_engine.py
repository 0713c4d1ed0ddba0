"""A minimal two-process serving engine for the end-to-end tests of the diagnoses beyond the GPU's memory.

Like vLLM V1's API server + EngineCore: this process answers ``/metrics`` (vLLM's names) on 127.0.0.1, and an
engine-core child does the work: each step burns CPU in pure Python for every running sequence and then
counts one generated token per sequence (a finished request every 32 tokens). Under a CPU quota the steps
slow down; stopped with SIGSTOP the counters freeze while the API process still answers. ``--hold-mib``
makes the core hold that much anonymous memory (the memory-cgroup test).

Prints ``PORT <port> CORE <pid>`` once serving. Exits after ``--max-seconds`` (never left behind).
"""
from __future__ import annotations

import argparse
import http.server
import multiprocessing as mp
import os
import sys
import threading
import time


def core(tokens, prompts, finished, running: int, work: int, hold_mib: int) -> None:
    held = bytearray(hold_mib * 1024 * 1024)
    for i in range(0, len(held), 4096):  # touch every page: resident, not just reserved
        held[i] = 1
    n = 0
    while True:
        for _ in range(running):
            x = 0
            for j in range(work):
                x += j * j
        tokens.value += running
        n += running
        if n >= 32 * running:
            n = 0
            finished.value += running
            prompts.value += 128 * running


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--running", type=int, default=4)
    ap.add_argument("--waiting", type=int, default=0)
    ap.add_argument("--work", type=int, default=2000, help="inner-loop iterations per sequence per step")
    ap.add_argument("--hold-mib", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=300.0)
    a = ap.parse_args()
    ctx = mp.get_context("fork")
    tokens, prompts, finished = (ctx.Value("d", 0.0, lock=False) for _ in range(3))
    p = ctx.Process(target=core, args=(tokens, prompts, finished, a.running, a.work, a.hold_mib), daemon=True)
    p.start()
    lab = '{model_name="mini",engine="0"}'

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = "\n".join([
                "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{lab} {a.running}",
                "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{lab} {a.waiting}",
                "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{lab} {tokens.value}",
                "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{lab} {prompts.value}",
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{model_name="mini",engine="0",finished_reason="stop"}} {finished.value}',
                ""]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(f"PORT {srv.server_address[1]} CORE {p.pid}", flush=True)
    deadline = time.monotonic() + a.max_seconds
    try:
        while time.monotonic() < deadline and p.is_alive():
            time.sleep(0.2)
    finally:
        p.kill()
        srv.shutdown()
    sys.exit(0 if time.monotonic() >= deadline else 3)


if __name__ == "__main__":
    main()
