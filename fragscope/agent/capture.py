"""Captures triggered by findings: a memory snapshot through the probe, a short vLLM profile.

Under a budget (at most ``max_per_hour`` captures, at most ``max_bytes`` on disk, the oldest
deleted first), once per ongoing finding. Each capture is analysed (snapshot / timeline detectors,
imported lazily) and returned as an attachment dict for ``Finding.attachments``. Protocol and
fields: docs/captures.md.
"""
from __future__ import annotations

import calendar
import json
import logging
import os
import re
import secrets
import shutil
import stat
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from .capture_files import (MAX_TAKE_BYTES, UnsafeFile, dir_bytes, trace_complete,  # noqa: F401
                            take_file, trusted_uids)

log = logging.getLogger(__name__)

KINDS = ("snapshot", "profile")


def default_triggers() -> dict[str, tuple[str, ...]]:
    """diagnosis id -> the captures that show "exactly where" (docs/captures.md#triggers), as each diagnosis
    declares them (``capture=`` in its registration)."""
    from ..playbooks import REGISTRY  # noqa: PLC0415  (the registry imports the detectors: only when capturing)

    return {d.id: tuple(d.capture) for d in REGISTRY if d.capture}


_SEV_RANK = {"info": 0, "warning": 1, "critical": 2}
_DIR_RE = re.compile(r"^(\d{8}T\d{6}Z)-(snapshot|profile)-([0-9a-f]{6})$")
_TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", ".json", ".json.gz")


class CaptureError(Exception):
    """Misconfiguration (one line): the capture could not even be attempted."""


@dataclass
class _Episode:
    """One ongoing finding (id + subject) and what was captured for it."""

    started: float
    last_seen: float
    done: set = field(default_factory=set)  # kinds captured (or attempted) in this episode
    attachments: list = field(default_factory=list)


def _http_post(url: str, timeout: float) -> tuple[int, str]:
    import http.client
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConnectionError(f"cannot reach {url}: not an http(s) URL")
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", (u.path or "/") + (f"?{u.query}" if u.query else ""), body=b"",
                     headers={"User-Agent": "fragscope", "Content-Length": "0"})
        resp = conn.getresponse()
        text = resp.read(4096).decode("utf-8", "replace")
        return resp.status, text
    except (socket.timeout, TimeoutError):
        raise TimeoutError(f"{url}: no answer within {timeout:.0f} s") from None
    except (OSError, http.client.HTTPException) as e:
        raise ConnectionError(f"cannot reach {url}: {_one_line(e)}") from None
    finally:
        conn.close()


def _one_line(e: BaseException | str) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]


def _verdict_of(result) -> tuple[str, object]:
    """(verdict, summary) from whatever an analyser returned: (doc, findings), a dict, an object."""
    doc, findings = result, None
    if isinstance(result, tuple) and len(result) == 2:
        doc, findings = result
    if hasattr(doc, "to_dict"):
        doc = doc.to_dict()
    verdict = None
    if isinstance(doc, Mapping):
        v = doc.get("verdict")
        if isinstance(v, Mapping):
            v = v.get("id") or v.get("summary")
        verdict = str(v) if v is not None else None
        vs = doc.get("verdicts")
        if verdict is None and isinstance(vs, (list, tuple)) and vs:
            verdict = ", ".join(str(x.get("id", x) if isinstance(x, Mapping) else x) for x in vs[:4])
    if findings:
        top = findings[0]
        fid = getattr(top, "id", None) or (top.get("id") if isinstance(top, Mapping) else None)
        summ = getattr(top, "summary", None) or (top.get("summary") if isinstance(top, Mapping) else None)
        if fid:
            verdict = f"{verdict}: {summ}" if verdict and summ else (summ and f"{fid}: {summ}") or verdict or fid
    if verdict is None:
        verdict = "analysed (no verdict)"
    return verdict, doc if isinstance(doc, Mapping) else str(doc)[:500]


class CaptureManager:
    """Decide, take, analyse and prune captures. Thread-compatible, not thread-safe: one caller.

    ``on_findings`` blocks while it captures (a profile takes ``profile_seconds`` plus the trace
    wait, a snapshot up to ``snapshot_timeout``): the daemon calls it from a worker thread.
    """

    def __init__(self, out_dir: str, probe_dir: str | None = None, vllm_urls: Iterable[str] = (), *,
                 max_per_hour: int | None = 4, max_bytes: int = 2 << 30, profile_seconds: float = 5.0,
                 http_timeout: float = 5.0, stop_timeout: float = 60.0, snapshot_timeout: float = 30.0,
                 snapshot_grace: float = 1.0, trace_timeout: float = 30.0, trace_settle_seconds: float = 1.0,
                 profiler_dir: str | None = None,
                 triggers: Mapping[str, Iterable[str]] | None = None, min_severity: str = "warning",
                 rearm_seconds: float = 900.0, poll_interval: float = 0.1, segments_only_ok: bool = True,
                 session=None, probe_uids: Iterable[int] = (),
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time) -> None:
        self.out_dir = os.fspath(out_dir)
        try:
            os.makedirs(self.out_dir, exist_ok=True)
        except OSError as e:
            raise CaptureError(f"cannot create capture directory {self.out_dir}: {e.strerror or e}") from None
        self.probe_dir = os.fspath(probe_dir) if probe_dir else None
        self.vllm_urls = tuple(u.rstrip("/") for u in vllm_urls if u)
        self.max_per_hour = max_per_hour
        self.max_bytes = int(max_bytes)
        self.profile_seconds = float(profile_seconds)
        self.http_timeout = float(http_timeout)
        self.stop_timeout = float(stop_timeout)
        self.snapshot_timeout = float(snapshot_timeout)
        self.snapshot_grace = float(snapshot_grace)
        self.trace_timeout = float(trace_timeout)
        self.trace_settle = float(trace_settle_seconds)
        self.profiler_dir = os.fspath(profiler_dir) if profiler_dir else None
        self.triggers = {k: tuple(v) for k, v in (triggers or default_triggers()).items()}
        self.min_rank = _SEV_RANK.get(min_severity, 1)
        self.rearm_seconds = float(rearm_seconds)
        self.poll = float(poll_interval)
        self.segments_only_ok = bool(segments_only_ok)
        self._session = session
        self.probe_uids = tuple(int(u) for u in probe_uids)
        self._sleep = sleep
        self._clock = clock
        self._episodes: dict[tuple, _Episode] = {}
        self._history: list[float] = self._existing_capture_times()
        self.budget_skips = 0
        self._budget_logged = False
        self._samples: list = []  # timeline samples from profiles, drained by pop_samples()

    # -- budget ---------------------------------------------------------------------------------
    def _existing_capture_times(self) -> list[float]:
        """Captures already on disk count against the hourly budget (the agent may have restarted)."""
        out = []
        try:
            names = os.listdir(self.out_dir)
        except OSError:
            return out
        for n in names:
            m = _DIR_RE.match(n)
            if m:
                try:
                    out.append(float(calendar.timegm(time.strptime(m.group(1), "%Y%m%dT%H%M%SZ"))))
                except (ValueError, OverflowError):
                    pass
        return sorted(out)

    def budget_left(self, now: float) -> int | None:
        """Captures still allowed in the trailing hour (None: unlimited)."""
        if self.max_per_hour is None:
            return None
        recent = [t for t in self._history if now - 3600.0 < t <= now + 60.0]
        return max(0, self.max_per_hour - len(recent))

    # -- triggering -----------------------------------------------------------------------------
    @staticmethod
    def _key(f) -> tuple:
        subject = getattr(f, "subject", None) or {}
        return (f.id, tuple(sorted((str(k), str(v)) for k, v in subject.items())))

    def _available(self, kind: str) -> bool:
        return (kind == "snapshot" and self.probe_dir is not None) or (kind == "profile" and bool(self.vllm_urls))

    def on_findings(self, findings: Iterable, now: float) -> list[dict]:
        """Capture for findings that newly became active (once per ongoing finding, within budget).

        Returns the new attachment dicts, each with ``finding`` (id) and ``subject``; findings are
        not modified (see :meth:`attachments_for`). A finding absent for ``rearm_seconds`` ends its
        episode; when it comes back it may be captured again.
        """
        findings = list(findings)
        for key in [k for k, ep in self._episodes.items() if now - ep.last_seen > self.rearm_seconds]:
            del self._episodes[key]
        new: list[dict] = []
        taken: dict[str, dict] = {}  # one capture per kind per call, shared by the findings that want it
        for f in findings:
            sev = getattr(getattr(f, "severity", None), "value", getattr(f, "severity", "info"))
            if _SEV_RANK.get(str(sev), 0) < self.min_rank:
                continue
            kinds = [k for k in self.triggers.get(f.id, ()) if k in KINDS and self._available(k)]
            key = self._key(f)
            ep = self._episodes.get(key)
            if ep is None:
                ep = self._episodes[key] = _Episode(started=now, last_seen=now)
            ep.last_seen = now
            for kind in kinds:
                if kind in ep.done:
                    continue
                att = taken.get(kind)
                if att is None:
                    left = self.budget_left(now)
                    if left is not None and left <= 0:
                        self.budget_skips += 1
                        if not self._budget_logged:
                            log.warning("capture budget of %d per hour used; %s for %s skipped",
                                        self.max_per_hour, kind, f.id)
                            self._budget_logged = True
                        continue  # try again on a later run, while the finding is still active
                    self._budget_logged = False
                    att = taken[kind] = self.capture(kind, now)
                ep.done.add(kind)
                a = dict(att, finding=f.id, subject=dict(getattr(f, "subject", {}) or {}))
                ep.attachments.append(a)
                new.append(a)
        return new

    def pop_samples(self) -> list:
        """fragscope_kernel_gap_seconds / fragscope_gpu_idle_ratio samples from profiles taken since
        the last call (the agent adds them to its history)."""
        out, self._samples = self._samples, []
        return out

    def attachments_for(self, finding) -> list[dict]:
        """Attachments captured for this finding's current episode (to re-attach on every run)."""
        ep = self._episodes.get(self._key(finding))
        return list(ep.attachments) if ep else []

    # -- capturing ------------------------------------------------------------------------------
    def capture(self, kind: str, now: float, target: str | None = None) -> dict:
        """Take one capture now, analyse it, enforce the size budget; returns the attachment dict.

        Failures (probe silent, endpoint down, no trace) come back as ``ok: False`` with ``error``;
        :class:`CaptureError` only for a kind that cannot be attempted with this configuration.
        """
        if kind not in KINDS:
            raise CaptureError(f"unknown capture kind {kind!r}; use snapshot or profile")
        if not self._available(kind):
            raise CaptureError("snapshot captures need a probe directory" if kind == "snapshot"
                               else "profile captures need a vLLM URL")
        cid = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}-{kind}-{secrets.token_hex(3)}"
        cdir = os.path.join(self.out_dir, cid)
        os.makedirs(cdir, exist_ok=True)
        self._history.append(now)
        att = {"kind": kind, "id": cid, "captured_at": now, "ok": False, "path": None, "paths": [],
               "verdict": "", "summary": None, "bytes": 0, "error": None}
        try:
            if kind == "snapshot":
                self._snapshot(cid, cdir, att)
            else:
                self._profile(target or self.vllm_urls[0], cdir, att)
        except Exception as e:  # a capture never takes the agent down
            att["ok"], att["error"] = False, f"{type(e).__name__}: {_one_line(e)}"
            att["verdict"] = f"{kind} failed: {att['error']}"
        att["bytes"] = dir_bytes(cdir)
        try:
            with open(os.path.join(cdir, "capture.json"), "w", encoding="utf-8") as fh:
                json.dump(att, fh, indent=1, default=str)
        except OSError as e:
            log.warning("cannot write %s/capture.json: %s", cdir, e)
        self.enforce_size_budget(keep_verdict_of=att)
        return att

    # snapshot ----------------------------------------------------------------------------------
    def _snapshot(self, cid: str, cdir: str, att: dict) -> None:
        pdir = self.probe_dir
        assert pdir is not None
        if not os.path.isdir(pdir):
            raise FileNotFoundError(f"probe directory {pdir} does not exist (is it shared with the engine?)")
        req = os.path.join(pdir, f"request-snapshot-{cid}.json")
        tmp = os.path.join(pdir, f".request-snapshot-{cid}.json.tmp")
        # fields the probe reads (fragscope/probe/core.py): pid (absent: every process answers),
        # segments_only_ok (dump segments even when memory history recording is off)
        body = {"id": cid, "kind": "snapshot", "requested_at": time.time(), "requester_pid": os.getpid(),
                "segments_only_ok": self.segments_only_ok}
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(body, fh)
        os.replace(tmp, req)  # atomic: the probe never sees a half-written request
        # each answering process writes snapshot-<pid>-<id>.pickle, then its status snapshot-<pid>-<id>.json
        rx = re.compile(r"^snapshot-(\d+)-" + re.escape(cid) + r"\.(pickle|json)$")
        status: dict[str, str] = {}  # pid -> status path
        pickles_seen: dict[str, str] = {}
        deadline = self._clock() + self.snapshot_timeout
        last_new: float | None = None
        try:
            while True:
                for name in os.listdir(pdir):
                    m = rx.match(name)
                    if not m:
                        continue
                    pid, ext = m.group(1), m.group(2)
                    bucket = status if ext == "json" else pickles_seen
                    if pid not in bucket:
                        bucket[pid] = os.path.join(pdir, name)
                        last_new = self._clock()
                t = self._clock()
                answered = set(status) | set(pickles_seen)
                complete = answered and all(p in status for p in answered)
                if complete and t - last_new >= self.snapshot_grace:
                    break  # every process that was going to answer has answered
                if t >= deadline:
                    break
                self._sleep(self.poll)
        finally:
            try:
                os.remove(req)
            except OSError:
                pass
        if not status and not pickles_seen:
            raise TimeoutError(f"no snapshot from the probe within {self.snapshot_timeout:.0f} s "
                               f"(is the fragscope probe running in the engine, watching {pdir}?)")
        errors, pickles = [], []
        uids = trusted_uids(pdir, self.probe_uids)
        for pid in sorted(set(status) | set(pickles_seen), key=int):
            st = {}
            if pid in status:
                dest = os.path.join(cdir, os.path.basename(status[pid]))
                try:  # never through a link planted in the probe directory (docs/captures.md#safety)
                    take_file(status[pid], dest, uids, remove=True, max_bytes=1 << 20)
                    with open(dest, encoding="utf-8") as fh:
                        st = json.load(fh)
                    if not isinstance(st, dict):
                        st = {}
                except UnsafeFile as e:
                    st = {"ok": False, "error": str(e)}
                except (OSError, ValueError):
                    st = {"ok": False, "error": "unreadable status file"}
            pk = pickles_seen.get(pid)
            if pk is None:
                cand = os.path.join(pdir, f"snapshot-{pid}-{cid}.pickle")
                pk = cand if os.path.lexists(cand) else None
            if pk is not None and st.get("ok", True):
                dest = os.path.join(cdir, os.path.basename(pk))
                try:
                    take_file(pk, dest, uids, remove=True)
                    pickles.append((pid, dest))
                except OSError as e:
                    errors.append(f"pid {pid}: {_one_line(str(e))}")
            else:
                errors.append(f"pid {pid}: {_one_line(str(st.get('error') or 'no snapshot written'))}")
        att["paths"] = [p for _, p in pickles]
        att["path"] = pickles[0][1] if pickles else None
        if not pickles:
            raise RuntimeError("probe could not dump a snapshot: " + "; ".join(errors))
        try:
            from ..snapshot_pipeline import diagnose_snapshot_file as analyse_snapshot_file
        except ImportError:
            analyse_snapshot_file = None
        verdicts, summaries = [], {}
        for pid, path in pickles:
            if analyse_snapshot_file is None:
                verdicts.append(f"pid {pid}: analysis unavailable")
                continue
            try:
                v, s = _verdict_of(analyse_snapshot_file(path))
            except Exception as e:  # SnapshotError and anything a bad file triggers
                v, s = f"analysis failed: {_one_line(e)}", None
            verdicts.append(f"pid {pid}: {v}")
            summaries[pid] = s
        att["ok"] = True
        att["verdict"] = "; ".join(verdicts + errors)
        att["summary"] = summaries or None
        if errors:
            att["error"] = "; ".join(errors)

    # profile -----------------------------------------------------------------------------------
    def _post(self, url: str, timeout: float) -> None:
        """POST with an empty body (vLLM's /start_profile, /stop_profile). http.client, not requests:
        the sidecar does not import requests (14.6 MB of RSS; collectors/http.py)."""
        if self._session is not None:  # an injected requests-like session (tests)
            r = self._session.post(url, timeout=timeout)
            code, text = r.status_code, getattr(r, "text", "") or ""
        else:
            code, text = _http_post(url, timeout)
        if code == 404:
            raise RuntimeError(f"{url}: 404, the vLLM profiler is not enabled "
                               "(start the server with VLLM_TORCH_PROFILER_DIR set)")
        if not 200 <= code < 300:
            raise RuntimeError(f"{url}: HTTP {code} {_one_line(text or '')}")

    def _traces(self, since: float) -> list[tuple[float, str]]:
        out = []
        root = self.profiler_dir
        if not root or not os.path.isdir(root):
            return out
        base_depth = root.rstrip(os.sep).count(os.sep)
        for dirpath, dirnames, files in os.walk(root):
            if dirpath.count(os.sep) - base_depth >= 2:
                dirnames[:] = []
            for f in files:
                if f.endswith(_TRACE_SUFFIXES) and not f.startswith("."):
                    p = os.path.join(dirpath, f)
                    try:
                        lst = os.lstat(p)  # a link planted among the traces is not followed
                    except OSError:
                        continue
                    m = lst.st_mtime
                    if stat.S_ISREG(lst.st_mode) and m >= since:
                        out.append((m, p))
        return sorted(out)

    def _profile(self, url: str, cdir: str, att: dict) -> None:
        wall_start = time.time() - 1.0  # mtime resolution and clock granularity
        self._post(url + "/start_profile", self.http_timeout)
        try:
            self._sleep(self.profile_seconds)
        finally:
            self._post(url + "/stop_profile", self.stop_timeout)
        if not self.profiler_dir:
            raise RuntimeError("profile taken, but the trace is not reachable here: give the engine's "
                               "VLLM_TORCH_PROFILER_DIR as mounted in this container (--profiler-dir)")
        # the trace may still be being written after stop returns: take the newest file once its
        # size has held for trace_settle_seconds and its content is complete (JSON closed, gzip whole)
        deadline = self._clock() + self.trace_timeout
        since: tuple[str, int, float] | None = None
        chosen = None
        while True:
            traces = self._traces(wall_start)
            if traces:
                p = traces[-1][1]
                try:
                    size = os.path.getsize(p)
                except OSError:
                    size = -1
                t = self._clock()
                if since is None or since[:2] != (p, size):
                    since = (p, size, t)
                elif size > 0 and t - since[2] >= self.trace_settle and trace_complete(p):
                    chosen = p
                    break
            if self._clock() >= deadline:
                break
            self._sleep(max(self.poll, 0.05))
        if chosen is None:
            raise TimeoutError(f"no new complete trace in {self.profiler_dir} within {self.trace_timeout:.0f} s of "
                               "/stop_profile")
        dest = os.path.join(cdir, os.path.basename(chosen))
        # the engine's directory is the engine's: copy, never move; safely (take_file)
        take_file(chosen, dest, trusted_uids(self.profiler_dir, self.probe_uids))
        att["path"], att["paths"] = dest, [dest]
        att["source_path"] = chosen
        try:
            from ..trace_pipeline import analyse_trace_file
        except ImportError:
            att["ok"], att["verdict"] = True, "analysis unavailable"
            return
        try:
            result = analyse_trace_file(dest)
            att["verdict"], att["summary"] = _verdict_of(result)
            from ..detectors.timeline import trace_samples

            # kernel-gap quantiles and idle share, recorded as signals by the agent (pop_samples)
            self._samples.extend(trace_samples(result[0], float(att.get("captured_at") or self._clock())))
        except Exception as e:
            att["verdict"] = f"analysis failed: {_one_line(e)}"
        att["ok"] = True

    # size budget -------------------------------------------------------------------------------
    def capture_dirs(self) -> list[str]:
        """Capture directories under out_dir, oldest first (names sort by time)."""
        try:
            names = sorted(n for n in os.listdir(self.out_dir) if _DIR_RE.match(n))
        except OSError:
            return []
        return [os.path.join(self.out_dir, n) for n in names]

    def enforce_size_budget(self, keep_verdict_of: dict | None = None) -> list[str]:
        """Delete the oldest captures until out_dir holds at most ``max_bytes``; returns deleted dirs."""
        dirs = self.capture_dirs()
        sizes = {d: dir_bytes(d) for d in dirs}
        total = sum(sizes.values())
        deleted = []
        for d in dirs:
            if total <= self.max_bytes:
                break
            shutil.rmtree(d, ignore_errors=True)
            total -= sizes[d]
            deleted.append(d)
            if keep_verdict_of is not None and os.path.basename(d) == keep_verdict_of.get("id"):
                keep_verdict_of["deleted"] = True
                keep_verdict_of["path"], keep_verdict_of["paths"] = None, []
                keep_verdict_of["verdict"] += (f" (files deleted: {sizes[d]} bytes exceed the capture budget of "
                                               f"{self.max_bytes} bytes)")
        if deleted:
            log.info("capture budget: deleted %d old capture(s)", len(deleted))
        return deleted
