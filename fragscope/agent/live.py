"""``diagnose URL``: find the metrics page behind a URL, recognise it, sample it and judge as it goes.

:func:`resolve` turns what the user typed (``http://host:8000``, ``host:8000``, a full
``/metrics`` URL) into a metrics URL and the kinds of page it serves (vLLM V1 / V0, SGLang, a
dcgm-exporter, the fragscope agent) through the one engine-URL resolver (collectors/endpoint.py),
failing within seconds, with a hint, on what cannot go away (refused, unknown host, 404 on every
candidate, not a metrics page).
:func:`watch` samples it, gives a first verdict after two scrapes and refines it until the
duration ends or Ctrl-C. Terminal output is the CLI's job (callbacks); this module does no printing.
docs/cli.md#live.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..collectors.endpoint import (KIND_TEXT, EndpointError, Resolved, candidates, classify,  # noqa: F401
                                   looks_like_url)  # re-exported: live.py's names before the resolver moved
from ..collectors.endpoint import normalise as _normalise
from ..collectors.endpoint import other_engine_names as _other_engine_names
from ..collectors.endpoint import resolve as _resolve
from ..model import CollectResult, Report, Sample, SeriesKey, Window
from .client import ClientError

__all__ = ["KIND_TEXT", "LiveError", "PageCollector", "Target", "candidates", "classify", "looks_like_url",
           "normalise", "resolve", "watch", "agent_status", "finding_line", "verdict_key", "parse_page"]

Target = Resolved  # a resolved live source (collectors/endpoint.py)


class LiveError(ClientError):
    """One line naming the URL, what went wrong and what to try."""


def normalise(arg: str) -> str:
    """``host:port[/path]`` -> ``http://host:port[/path]``; an http(s) URL is kept."""
    try:
        return _normalise(arg)
    except EndpointError as e:
        raise LiveError(str(e)) from None


def resolve(arg: str, timeout_s: float = 10.0, fetch: Callable[..., str] | None = None) -> Target:
    """Find the metrics page behind ``arg`` (collectors/endpoint.py's resolver, the one every
    command and the agent use). Raises LiveError (one line, with a hint) at once on what cannot go away."""
    try:
        return _resolve(arg, timeout_s=timeout_s, fetch=fetch)
    except EndpointError as e:
        raise LiveError(str(e)) from None


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
          first_after: int = 2, refine_s: float = 5.0,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
          wall: Callable[[], float] = time.time) -> tuple[Window, Report, Progress]:
    """Sample ``collector`` every ``interval_s`` for ``duration_s``; judge after ``first_after``
    good scrapes (the first verdict), then again after a new scrape once ``refine_s`` seconds have
    passed (5 s: each scrape at the default interval, so a storm that starts after the first verdict
    is named at the next scrape that shows it, not up to 15 s later), unless judging would take more
    than a tenth of the time, and once at the end. Ctrl-C (KeyboardInterrupt) ends sampling early: the final verdict is still given.
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
