"""``diagnose URL``: find the metrics page behind a URL, recognise it, sample it and judge as it goes.

:func:`resolve` turns what the user typed (``http://host:8000``, ``host:8000``, a full
``/metrics`` URL) into a metrics URL and the kinds of page it serves (vLLM V1 / V0, SGLang, a
dcgm-exporter, the fragscope agent), failing within seconds, with a hint, on what cannot go
away (refused, unknown host, 404 on both the URL and ``/metrics``, not a metrics page).
:func:`watch` samples it, gives a first verdict after two scrapes and refines it until the
duration ends or Ctrl-C. Terminal output is the CLI's job (callbacks); this module does no printing.
docs/cli.md#live.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit, urlunsplit

from ..model import CollectResult, Reason, Report, Sample, SeriesKey, Window
from .client import ClientError

KIND_TEXT = {"vllm-v1": "vLLM (V1 engine)", "vllm-v0": "vLLM (V0 engine)", "vllm": "vLLM",
             "sglang": "SGLang", "dcgm": "dcgm-exporter", "agent": "fragscope agent",
             "engine": "TGI / Triton / TensorRT-LLM"}
# host:port, [v6]:port, optionally followed by a path: what people paste from `kubectl get svc`
_HOSTPORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})(/.*)?$")
_FATAL_CONN = ("connection refused", "host name not found", "host unreachable", "invalid URL")


class LiveError(ClientError):
    """One line naming the URL, what went wrong and what to try."""


def looks_like_url(arg: str) -> bool:
    """True for an http(s):// URL or a bare ``host:port[/path]`` (the caller checks first that
    ``arg`` is not an existing file)."""
    return bool(re.match(r"^https?://", arg, re.I) or _HOSTPORT.match(arg))


def normalise(arg: str) -> str:
    """``host:port[/path]`` -> ``http://host:port[/path]``; an http(s) URL is kept."""
    s = arg.strip()
    if not re.match(r"^https?://", s, re.I):
        s = "http://" + s
    parts = urlsplit(s)
    try:
        port = parts.port
    except ValueError:
        raise LiveError(f"{arg}: bad port (expected host:PORT with PORT in 1-65535)") from None
    if not parts.hostname or (port is not None and not 0 < port < 65536):
        raise LiveError(f"{arg}: expected http://host:port[/metrics] or host:port")
    return s


def candidates(url: str) -> list[str]:
    """URLs to try, in order: ``/metrics`` first when the path is empty, else the URL, then
    ``URL/metrics``."""
    parts = urlsplit(url)
    path = parts.path or ""
    if path in ("", "/"):
        base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        return [base + "/metrics", base + "/"]
    out = [url]
    if not path.rstrip("/").endswith("/metrics") and not parts.query:
        out.append(url.rstrip("/") + "/metrics")
    return out


def classify(text: str) -> list[str]:
    """The kinds of page ``text`` is, from its metric names (several for a concatenated page)."""
    head = text.lstrip()[:2000]
    if head.startswith("{"):
        return ["agent"] if '"fragscope agent"' in head else []
    names = set()
    for line in text.splitlines():
        if line and line[0] != "#":
            names.add(line.split("{", 1)[0].split(None, 1)[0])
    if names & {"fragscope_agent_info", "fragscope_collector_up", "fragscope_diagnosis_active"}:
        return ["agent"]  # families only the agent's exporter writes
    kinds = []
    vllm = {n[4:] if n.startswith("ray_") else n for n in names if n.startswith(("vllm:", "ray_vllm:"))}
    if vllm:
        if "vllm:kv_cache_usage_perc" in vllm or any(n.startswith("vllm:inter_token_latency") for n in vllm):
            kinds.append("vllm-v1")
        elif "vllm:gpu_cache_usage_perc" in vllm:
            kinds.append("vllm-v0")
        else:
            kinds.append("vllm")
    if any(n.startswith("sglang:") for n in names):
        kinds.append("sglang")
    if any(n.startswith("DCGM_FI_") for n in names):
        kinds.append("dcgm")
    if names & _other_engine_names():
        kinds.append("engine")  # TGI, Triton / TensorRT-LLM: read through the signal table (docs/engines.md)
    return kinds


def _other_engine_names() -> frozenset[str]:
    from ..collectors.engines import other_engine_names

    return other_engine_names() - {n for n in other_engine_names() if n.startswith("sglang:")}


@dataclass
class Target:
    """A resolved live source: the URL that answered, its base, the kinds of page, the first body."""

    asked: str
    url: str
    base: str
    kinds: list[str]
    first_text: str = ""
    tried: list[str] = field(default_factory=list)

    @property
    def is_agent(self) -> bool:
        return "agent" in self.kinds

    def describe(self) -> str:
        return " + ".join(KIND_TEXT.get(k, k) for k in self.kinds)


def resolve(arg: str, timeout_s: float = 10.0, fetch: Callable[..., str] | None = None) -> Target:
    """Find the metrics page behind ``arg``. Raises LiveError (one line, with a hint) at once on
    what cannot go away; a page that times out counts as not answering."""
    from ..collectors.http import FetchError, http_get

    fetch = fetch or http_get
    url = normalise(arg)
    problems: list[str] = []
    tried = []
    for cand in candidates(url):
        tried.append(cand)
        try:
            text = fetch(cand, timeout_s=timeout_s)
        except FetchError as e:
            msg = str(e)
            low = msg.lower()
            if any(f in low for f in _FATAL_CONN):
                hint = ("is the server running, and is the port right?" if "refused" in low else
                        "check the host name" if "host name" in low else "check the address")
                raise LiveError(f"{msg}; {hint}") from None
            if e.reason == Reason.TIMEOUT:
                raise LiveError(f"{msg}; the server accepted the connection but sent no metrics in time "
                                "(overloaded, or not an HTTP metrics endpoint)") from None
            problems.append(_short(msg, cand))
            continue
        kinds = classify(text)
        if kinds:
            p = urlsplit(cand)
            path = p.path.rstrip("/")
            if path.endswith("/metrics"):
                path = path[: -len("/metrics")]
            # the base keeps a path prefix (an agent behind a reverse proxy at /fragscope/)
            base = urlunsplit((p.scheme, p.netloc, path, "", ""))
            return Target(arg, cand, base, kinds, text, tried)
        problems.append(f"{cand}: not a page fragscope reads (no vllm:, sglang:, DCGM_FI_ or fragscope "
                        "agent metrics)")
    raise LiveError("; ".join(problems) + "; give the server's metrics URL (vLLM and SGLang: "
                    "http://host:port/metrics; dcgm-exporter: http://host:9400/metrics)")


def _short(msg: str, url: str) -> str:
    return msg if msg.startswith(url) else f"{url}: {msg}"


# ---------------------------------------------------------------------------------------------
def parse_page(text: str, ts: float, kinds: list[str], source: str, caches: dict) -> list[Sample]:
    """The samples of one scrape that the detectors read, by page kind (pure but for ``caches``).
    Raises exposition.ParseError."""
    from ..collectors.exposition import LineCache, scrape_samples

    def lines(kind: str) -> LineCache:
        c = caches.get(kind + "_lines")
        if c is None:
            c = caches[kind + "_lines"] = LineCache()
        return c

    out: list[Sample] = []
    if any(k.startswith("vllm") for k in kinds):
        from ..collectors.vllm import parse_vllm_metrics

        out += parse_vllm_metrics(text, ts, source=source, key_cache=caches.setdefault("vllm", {}),
                                  lines=lines("vllm"))
    if "sglang" in kinds:
        out += [s for s in scrape_samples(text, ts, source, caches.setdefault("sglang", {}))
                if s.name.startswith("sglang:")]
    if "engine" in kinds:
        from ..collectors.engines import engine_samples

        keep = _other_engine_names()
        out += [s for s in engine_samples(text, ts, source, caches.setdefault("engine", {})) if s.name in keep]
    if "dcgm" in kinds:
        from ..collectors.dcgm import parse_dcgm_metrics

        out += parse_dcgm_metrics(text, ts, source=source, key_cache=caches.setdefault("dcgm", {}),
                                  lines=lines("dcgm"))
    return out


class PageCollector:
    """One fetch per tick of a resolved page, parsed for every kind it serves. Never raises."""

    def __init__(self, target: Target, timeout_s: float = 5.0, fetch: Callable[..., str] | None = None) -> None:
        from ..collectors.http import http_get

        self.target = target
        self.name = target.url
        self.timeout_s = timeout_s
        self.fetch = fetch or http_get
        self._caches: dict = {}
        self._pending = target.first_text or None  # the body resolve() already read

    def collect(self, now: float) -> CollectResult:
        from ..collectors.exposition import ParseError
        from ..collectors.http import FetchError

        text, self._pending = self._pending, None
        try:
            if text is None:
                text = self.fetch(self.target.url, timeout_s=self.timeout_s)
            samples = parse_page(text, now, self.target.kinds, self.target.url, self._caches)
        except (FetchError, ParseError) as e:
            return CollectResult(up=False, error=str(e).splitlines()[0][:300])
        except Exception as e:  # noqa: BLE001 - never raise into the sampling loop
            return CollectResult(up=False, error=f"{self.target.url}: {type(e).__name__}: {e}"[:300])
        if not samples:
            return CollectResult(up=False, error=f"{self.target.url}: no metrics fragscope reads in this scrape")
        return CollectResult(samples=samples)


# ---------------------------------------------------------------------------------------------
@dataclass
class Progress:
    """What the CLI shows while sampling."""

    round: int = 0
    ok_rounds: int = 0
    samples: int = 0
    elapsed_s: float = 0.0
    last_error: str | None = None
    report: Report | None = None
    verdicts: int = 0
    interrupted: bool = False


def watch(collector: Any, duration_s: float, interval_s: float, *, source: str,
          judge: Callable[[Window], Report] | None = None,
          on_verdict: Callable[[Report, Progress, bool], None] | None = None,
          on_round: Callable[[Progress], None] | None = None,
          first_after: int = 2, refine_s: float = 15.0,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
          wall: Callable[[], float] = time.time) -> tuple[Window, Report, Progress]:
    """Sample ``collector`` every ``interval_s`` for ``duration_s``; judge after ``first_after``
    good scrapes (the first verdict), then again at least every ``refine_s`` seconds, and once at
    the end. Ctrl-C (KeyboardInterrupt) ends sampling early: the final verdict is still given.
    Raises LiveError when no scrape succeeded."""
    if judge is None:
        from ..pipeline import diagnose as judge  # noqa: N813
    from .store import infer_types

    rounds = max(1, int(duration_s // interval_s) + 1)
    samples: list[Sample] = []
    prog = Progress()
    t0 = clock()
    last_judged = -1e18
    judge_cost = 0.0
    errors: list[str] = []

    def window() -> Window:
        keys = {SeriesKey(s.name, s.labels) for s in samples}
        w = Window.from_samples(samples, source=source, types=infer_types(keys))
        if prog.interrupted:
            w.notes.append(f"sampling stopped by Ctrl-C after {prog.ok_rounds} scrapes ({prog.elapsed_s:.0f} s)")
        if prog.ok_rounds < prog.round:
            w.notes.append(f"{prog.round - prog.ok_rounds} of {prog.round} scrapes failed"
                           + (f" (last: {errors[-1]})" if errors else ""))
        return w

    def run_judge(final: bool) -> None:
        nonlocal last_judged, judge_cost
        c = clock()
        rep = judge(window())
        judge_cost = clock() - c
        last_judged = clock()
        first = prog.verdicts == 0
        prog.report = rep
        prog.verdicts += 1
        if on_verdict is not None:
            on_verdict(rep, prog, first and not final)

    try:
        for r in range(rounds):
            delay = t0 + r * interval_s - clock()
            if delay > 0:
                sleep(delay)
            res = collector.collect(wall())
            prog.round = r + 1
            prog.elapsed_s = clock() - t0
            if res.up and res.samples:
                samples.extend(res.samples)
                prog.ok_rounds += 1
                prog.samples += len(res.samples)
                prog.last_error = None
            else:
                prog.last_error = res.error or "no samples"
                errors.append(prog.last_error)
            if on_round is not None:
                on_round(prog)
            last = r == rounds - 1
            # refine no more often than refine_s, nor so often that judging costs >10 % of the time
            if not last and prog.ok_rounds >= first_after and \
                    (prog.verdicts == 0 or clock() - last_judged >= max(refine_s, 10 * judge_cost)):
                run_judge(final=False)
    except KeyboardInterrupt:
        prog.interrupted = True
        prog.elapsed_s = clock() - t0
    if not samples:
        if prog.interrupted and not errors:
            raise LiveError(f"interrupted by Ctrl-C before the first scrape ({prog.elapsed_s:.0f} s)")
        why = "; ".join(dict.fromkeys(errors)) or "no samples"
        raise LiveError(f"no data sampled in {prog.elapsed_s:.0f} s: {why}")
    w = window()
    rep = judge(w)
    prog.report = rep
    prog.verdicts += 1
    return w, rep, prog


def finding_line(f: Any) -> str:
    return f"{f.severity.value.upper()} {f.id}: {f.summary}"


def verdict_key(rep: Report) -> set[tuple[str, str]]:
    return {(f.id, f.severity.value) for f in rep.findings}


def agent_status(base: str, timeout_s: float = 10.0) -> tuple[dict | None, dict | None]:
    """The agent's ``/api/v1/status`` and ``/readyz`` bodies (None when unreadable)."""
    from ..collectors.http import FetchError, http_get

    out = []
    for path in ("/api/v1/status", "/readyz"):
        try:
            body = http_get(base.rstrip("/") + path, timeout_s=timeout_s, max_bytes=4 << 20, ok_status=(503,))
            out.append(json.loads(body))
        except (FetchError, ValueError, TypeError):
            out.append(None)
    return out[0], out[1]
