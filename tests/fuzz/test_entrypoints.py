"""Every CLI entry point that reads a file or a page, against each class of hostile input that broke one
(tests/fuzz/entrypoints.py): exit 0, 1 or 2 with one line, never a crash, a hang or a sentinel on screen.
The scaling check (1x, 4x, 16x inputs as real processes: time and peak memory grow linearly) runs in the
long run (-m e2e, .ci/run)."""
from __future__ import annotations

import gzip
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import entrypoints  # noqa: E402
import harness  # noqa: E402
from harness import judge  # noqa: E402

CASES = {c.name: c for c in entrypoints.CASES}


@pytest.fixture(scope="module")
def casedir(tmp_path_factory):
    return tmp_path_factory.mktemp("entrypoints")


def _check(argv: list[str], prog: str, fmts=("human", "json")) -> list:
    outs = []
    for fmt in fmts:
        a = argv + (["--format", fmt] if fmt else [])
        o = harness.run_inprocess(a, timeout_s=60.0, prog=prog)
        assert judge(o, fmt or "human") is None, (a[:3], fmt, o.rc, o.signature, o.stderr[-500:])
        assert "\x00" not in o.stderr and "\x00" not in o.stdout
        outs.append(o)
    return outs


@pytest.mark.parametrize("name", sorted(CASES))
def test_entry_point_keeps_the_contract(name, casedir):
    case = CASES[name]
    d = casedir / name
    d.mkdir(exist_ok=True)
    argv = case.make(d, 1)
    _check(argv, case.prog, fmts=(None,) if "--html" in argv else ("human", "json"))


def test_html_report_of_denormal_gauges_is_written(casedir):
    d = casedir / "html"
    d.mkdir(exist_ok=True)
    argv = CASES["html--denormal-and-huge-gauges"].make(d, 1)
    (o,) = _check(argv, "diagnose", fmts=(None,))
    assert o.rc in (0, 1) and (d / "denormal.html").stat().st_size > 1000


def test_overlong_line_error_names_the_line_not_a_marker(tmp_path):
    p = tmp_path / "only_long.prom"
    p.write_text("vllm:num_requests_waiting " + "9" * (2 << 20) + "\n")
    (o,) = _check(["scrape", str(p)], "diagnose", fmts=("human",))
    assert o.rc == 2 and "longer than 1,048,576 characters" in o.stderr, o.stderr


def test_scrape_reads_gzip_through_the_decompression_cap(tmp_path, monkeypatch):
    p = tmp_path / "bomb.prom.gz"
    p.write_bytes(gzip.compress(b"vllm:num_requests_waiting 1\n" * 100_000))  # 2.8 MB once inflated
    monkeypatch.setenv("FRAGSCOPE_MAX_DECOMPRESSED_BYTES", str(1 << 20))
    (o,) = _check(["scrape", str(p)], "diagnose", fmts=("human",))
    assert o.rc == 2 and "decompresses to more than" in o.stderr


# --- diagnose URL against a hostile server on 127.0.0.1 ---------------------------------------------
PAGE = entrypoints.VLLM_PAGE.read_bytes()
HOSTILE_PAGES = {
    "/churn/metrics": PAGE + b"".join(b'vllm:num_requests_waiting{model_name="m",request_id="%d"} 1\n' % i
                                      for i in range(20_000)),
    "/label/metrics": PAGE + b'vllm:num_requests_waiting{model_name="' + b"x" * 900_000 + b'"} 1\n',
    "/denormal/metrics": PAGE.replace(b"vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny\"} 0.0",
                                      b"vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny\"} 5e-324"),
    "/nan/metrics": PAGE.replace(b"vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"} 0.0",
                                 b"vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"} " + b"9" * 400),
    "/garbage/metrics": b"\x00\xff" * 5000,
    "/deep/metrics": b"[" * 100_000,
}


@pytest.fixture(scope="module")
def hostile_server():
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):  # noqa: N802
            body = HOSTILE_PAGES.get(self.path)
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _url_case(url: str, out: Path, fmts=("human", "json")) -> None:
    short = ["--duration", "1s", "--interval", "0.5s"]  # three scrapes, as tests/test_live_url.py samples
    _check([url, *short], "diagnose", fmts)
    _check([url, *short, "--html", str(out / "r.html")], "diagnose", fmts=(None,))


def test_diagnose_url_against_a_hostile_page(hostile_server, tmp_path):
    _url_case(hostile_server + "/label/metrics", tmp_path, fmts=("json",))


@pytest.mark.e2e
@pytest.mark.parametrize("path", sorted(HOSTILE_PAGES))
def test_diagnose_url_against_a_hostile_server(path, hostile_server, tmp_path):
    _url_case(hostile_server + path, tmp_path)


# --- scaling: time and peak memory linear in the input (long run) ---------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.scales))
def test_time_and_memory_grow_linearly(name, tmp_path):
    case = CASES[name]
    got = {}
    for k in (1, 4, 16):
        d = tmp_path / f"x{k}"
        d.mkdir()
        argv = case.make(d, k)
        size = sum(os.path.getsize(a) for a in argv if os.path.isfile(a))
        o = harness.run_subprocess(argv + ["--format", "json"], timeout_s=300.0, mem_bytes=4 << 30, prog=case.prog)
        assert judge(o, "json") is None, (name, k, o.rc, o.signature, o.stderr[-400:])
        got[k] = (o.seconds, o.peak_rss_bytes or 0, size)
    print(f"{name}: " + "; ".join(f"{k}x {s / 1e6:.1f} MB in: {t:.2f} s, peak {m / 2**20:.0f} MiB"
                                   for k, (t, m, s) in got.items()), file=sys.stderr)
    (t1, m1, _), (t4, m4, _), (t16, m16, _) = got[1], got[4], got[16]
    # Linear growth makes 16x cost at most ~4x what 4x costs (fixed costs make it less); quadratic makes
    # it 16x. The bound leaves room for a loaded machine.
    assert t16 <= 8 * t4 + 2.0, (name, got)
    assert m16 <= 8 * m4, (name, got)
    json.dumps(got)


# --- the minimised reproducers of these classes (tests/fuzz/repro/README.md) ----------------------------
def _repro_argv(path: Path, out: Path) -> tuple[list[str], str, tuple]:
    entry = path.name.split("--")[0]
    p = str(path)
    return {
        "scrape": (["scrape", p], "diagnose", ("human", "json")),
        "html": ([p, "--html", str(out / "r.html")], "diagnose", (None,)),
        "triton-batching": (["triton-batching", "--config", p, str(entrypoints.TRITON_PAGE), "--model", "tensorrt_llm"],
                            "diagnose", ("human", "json")),
        "ort-profile": (["ort-profile", p], "diagnose", ("human", "json")),
        "kv-budget": (["kv-budget", "--model-config", p, "--gpu-memory-gib", "80", "--weights-gib", "16"], "fragscope",
                      ("human", "json")),
        "size": (["size", "--log", p], "fragscope", ("human", "json")),
    }[entry]


REPROS = sorted(p for p in harness.REPRO_DIR.iterdir()
                if p.name.split("--")[0] in ("scrape", "html", "triton-batching", "ort-profile", "kv-budget", "size"))


@pytest.mark.parametrize("path", REPROS, ids=[p.name for p in REPROS])
def test_reproducers_of_every_entry_point(path, tmp_path):
    argv, prog, fmts = _repro_argv(path, tmp_path)
    _check(argv, prog, fmts)
