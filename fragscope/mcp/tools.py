"""The tools of ``fragscope mcp``: each a thin layer over the function the CLI calls for the same question.

Every tool returns a :class:`Answer` (the CLI's ``--format json`` document and the lists the text summary is
made from) or raises :class:`ToolFailure` (one line, like the CLI's exit-2 message). Paths and URLs are
checked by the server's :class:`~fragscope.mcp.policy.Policy` before anything is read or fetched.
No SDK import here (the server module wraps these).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .policy import Policy, PolicyError

MAX_LIVE_SECONDS = 120.0  # a live sampling through the assistant: 2 minutes at most (`diagnose URL` default)
DEFAULT_LIVE_SECONDS = 10.0  # first verdict after two scrapes (5 s), a refined one at 10 s
MAX_DEEP_LIMIT = 100


class ToolFailure(Exception):
    """The question cannot be answered (bad input, refused path or URL, unreachable server): one line."""


@dataclass
class Answer:
    """A tool's result: ``doc`` is the JSON contract of the CLI command it mirrors."""

    tool: str
    source: str
    doc: dict
    findings: list[dict] = field(default_factory=list)  # Finding.to_dict() shapes, ranked
    could_not_judge: list[dict] = field(default_factory=list)  # Inconclusive.to_dict() shapes
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # tool-specific facts for the summary (first verdict, ...)
    text: str | None = None  # a tool whose answer is its own prose (explain, kv-budget, size)


def _plain(obj: Any) -> Any:
    """JSON types only: numpy scalars, NaN/Inf (None), dataclasses with to_dict (the CLI's encoders)."""
    from ..cli.render import json_default
    from ..units import json_safe

    return json.loads(json.dumps(json_safe(obj), default=json_default, allow_nan=False))


def _cli(fn, *args, **kwargs):
    """Call a CLI function; its one-line usage error (click.ClickException) becomes a ToolFailure."""
    import click

    try:
        return fn(*args, **kwargs)
    except click.ClickException as e:
        raise ToolFailure(e.format_message()) from None
    except PolicyError as e:
        raise ToolFailure(str(e)) from None


def _report_answer(tool: str, report, extra: dict | None = None) -> Answer:
    doc = _plain(report.to_dict())
    sig = doc.get("signals") if isinstance(doc.get("signals"), dict) else {}
    # a source that was down makes the verdict incomplete: said first, never a silent "healthy"
    cnj = [{"id": "source-down", "missing": [], "reason": str(d), "subject": {}} for d in sig.get("sources_down") or []]
    cnj += list(doc.get("inconclusive") or [])
    return Answer(tool, doc.get("source") or "", doc, doc.get("findings") or [], cnj, list(sig.get("notes") or []),
                  extra or {})


def _file(policy: Policy, path: str) -> str:
    try:
        real, _ = policy.resolve_file(path)
    except PolicyError as e:
        raise ToolFailure(str(e)) from None
    return real


def _url(policy: Policy, url: str) -> str:
    try:
        return policy.check_url(url)
    except PolicyError as e:
        raise ToolFailure(str(e)) from None


def _duration_text(seconds: float | None, what: str) -> str | None:
    if seconds is None:
        return None
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise ToolFailure(f"{what}: a positive number of seconds")
    return f"{float(seconds):g}s"


# --- files ------------------------------------------------------------------------------------------
def diagnose_file(policy: Policy, path: str, since: str | None = None) -> Answer:
    """``diagnose FILE``: a recording or scrapes; an engine log, a trace or a memory snapshot is read by its
    own reader, as the CLI reroutes it."""
    from ..cli import diagnose_cmd

    real = _file(policy, path)
    try:
        window, report = _cli(diagnose_cmd.diagnose_path, real, since)
    except diagnose_cmd.OtherKind as other:
        if since:
            raise ToolFailure(f"{path}: since applies to metrics recordings; this file is read as: "
                              f"diagnose {other.reader}") from None
        return _other_kind(other.reader, real)
    ans = _report_answer("diagnose_file", report)
    ans.extra["read_as"] = "recording"
    return ans


def _other_kind(reader: str, real: str) -> Answer:
    if reader == "logs":
        from ..cli.logs_cmd import analyse_log_file, log_json

        report, summary, _acc = _cli(analyse_log_file, real)
        ans = _report_answer("diagnose_file", report)
        ans.doc = _plain(log_json(report, summary))
        ans.notes = list(summary.get("notes") or [])
    elif reader == "trace":
        from ..cli.trace_cmd import analyse_trace, trace_json

        analysis, findings, report = _cli(analyse_trace, real)
        doc = _plain(trace_json(analysis, findings))
        ans = Answer("diagnose_file", real, doc, doc.get("findings") or [], doc.get("inconclusive") or [],
                     list(doc.get("notes") or []))
    else:
        from ..cli.snapshot_cmd import analyse_snapshot

        doc, _findings, _snap = _cli(analyse_snapshot, real)
        doc = _plain(doc)
        ans = Answer("diagnose_file", real, doc, doc.get("findings") or [], doc.get("inconclusive") or [],
                     list(doc.get("notes") or []))
    ans.extra["read_as"] = reader
    return ans


def judge_triton_batching(policy: Policy, config_path: str, scrape_paths: list[str], model: str | None = None,
                          interval_seconds: float | None = None) -> Answer:
    """``diagnose triton-batching SCRAPE... --config config.pbtxt``: a Triton model's dynamic-batching settings
    judged against its counters in one or more saved /metrics scrapes."""
    from ..cli.engines_cmd import triton_batching_report

    if not isinstance(scrape_paths, list) or not 1 <= len(scrape_paths) <= 20:
        raise ToolFailure("scrape_paths: one to 20 saved /metrics scrapes of the Triton server")
    cfg = _file(policy, config_path)
    scrapes = tuple(_file(policy, p) for p in scrape_paths)
    if interval_seconds is not None and not (isinstance(interval_seconds, (int, float))
                                             and 0 < interval_seconds <= 3600):
        raise ToolFailure("interval_seconds: 0 < seconds <= 3600")
    report, extra = _cli(triton_batching_report, scrapes, None, cfg, model, interval_seconds)
    ans = _report_answer("judge_triton_batching", report, {"model": extra.get("model")})
    ans.doc.update(_plain(extra))
    return ans


def size_from_log(policy: Policy, log_path: str, recording_path: str | None = None,
                  gpu_memory_gib: float | None = None, gpu_memory_utilization: float | None = None,
                  margin_gib: float | None = None, target_concurrency: int | None = None,
                  target_len: int | None = None) -> Answer:
    """``fragscope size --log FILE [--recording FILE]``."""
    from ..cli.sizing_cmd import sizing_text, size_from_log as size, size_json
    from ..units import GiB

    log_real = _file(policy, log_path)
    rec_real = _file(policy, recording_path) if recording_path else None
    for name, v, lo, hi in (("gpu_memory_gib", gpu_memory_gib, 0, 1 << 20), ("margin_gib", margin_gib, 0, 1 << 20),
                            ("gpu_memory_utilization", gpu_memory_utilization, 0, 1)):
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and lo <= v <= hi
                                  and (name == "margin_gib" or v > 0)):
            raise ToolFailure(f"{name}: {v!r} out of range")
    acc, rt, rec = _cli(size, log_real, rec_real, margin_gib, target_concurrency, target_len,
                        None if gpu_memory_gib is None else gpu_memory_gib * GiB, gpu_memory_utilization)
    doc = _plain(size_json(acc, rt, rec))
    r = doc["recommendation"]
    cnj = [{"id": "sizing", "missing": [m], "reason": "needed to decide", "subject": {}} for m in r.get("missing") or []]
    return Answer("size_from_log", log_real, doc, [], cnj, list(r.get("notes") or []),
                  {"status": r.get("status")}, text=sizing_text(acc, rt, rec))


def kv_budget(policy: Policy, gpu_memory_gib: float | None = None, gpu_memory_utilization: float = 0.9,
              weights_gib: float | None = None, overhead_gib: float = 0.0, block_size: int = 16,
              num_layers: int | None = None, num_kv_heads: int | None = None, head_dim: int | None = None,
              dtype_bytes: float | None = None, max_seq_len: int | None = None, avg_seq_len: float | None = None,
              target_concurrency: int | None = None, target_len: int | None = None,
              tensor_parallel_size: int = 1, model_config_path: str | None = None) -> Answer:
    """``fragscope kv-budget``: blocks and concurrency, block-size waste, or the GPU a target needs."""
    from ..cli.kv_budget_cmd import kv_budget_answer
    from ..units import GiB

    for name, v in (("gpu_memory_gib", gpu_memory_gib), ("weights_gib", weights_gib), ("overhead_gib", overhead_gib),
                    ("dtype_bytes", dtype_bytes), ("avg_seq_len", avg_seq_len)):
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v <= 1 << 30):
            raise ToolFailure(f"{name}: {v!r} is not a finite size")
    if not (isinstance(gpu_memory_utilization, (int, float)) and 0 < gpu_memory_utilization <= 1):
        raise ToolFailure(f"gpu_memory_utilization: {gpu_memory_utilization!r} is not in (0, 1]")
    for name, v in (("block_size", block_size), ("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                    ("head_dim", head_dim), ("max_seq_len", max_seq_len), ("target_concurrency", target_concurrency),
                    ("target_len", target_len), ("tensor_parallel_size", tensor_parallel_size)):
        if v is not None and not (isinstance(v, int) and 1 <= v <= 1 << 40):
            raise ToolFailure(f"{name}: {v!r} is not a positive integer")
    cfg = _file(policy, model_config_path) if model_config_path else None
    gib = (lambda v: None if v is None else float(v) * GiB)
    doc, text = _cli(kv_budget_answer, gib(gpu_memory_gib), gpu_memory_utilization, gib(weights_gib),
                     gib(overhead_gib) or 0.0, block_size, num_layers, num_kv_heads, head_dim, dtype_bytes,
                     max_seq_len, avg_seq_len, target_concurrency, target_len, tensor_parallel_size, cfg)
    return Answer("kv_budget", cfg or "arguments", _plain(doc), text=text,
                  extra={"mode": doc.get("mode", "forward")})


# --- live sources -----------------------------------------------------------------------------------
def diagnose_url(policy: Policy, url: str, duration_seconds: float | None = None,
                 interval_seconds: float | None = None, since: str | None = None,
                 max_seconds: float = MAX_LIVE_SECONDS) -> Answer:
    """``diagnose URL``: a vLLM / SGLang page or a dcgm-exporter sampled for a short while (first verdict after
    two scrapes), or a fragscope agent's history."""
    from ..agent.client import ClientError
    from ..agent.live import LiveError, resolve
    from ..cli import agent_cmds

    full = _url(policy, url)
    if duration_seconds is not None and isinstance(duration_seconds, (int, float)) and duration_seconds > max_seconds:
        raise ToolFailure(f"duration_seconds: at most {max_seconds:g} s through this server (the call's time "
                          "bound); for longer, run fragscope agent and read its history")
    try:
        target = resolve(full)
    except LiveError as e:
        raise ToolFailure(str(e)) from None
    if target.is_agent:
        if duration_seconds is not None or interval_seconds is not None:
            raise ToolFailure(f"{target.base} is a fragscope agent: it has history; give since (e.g. 1h), not "
                              "a duration")
        return _agent_answer("diagnose_url", target.base, since)
    if since:
        raise ToolFailure("since reads history (a file or an agent); a live page is sampled from now: give "
                          "duration_seconds")
    dur = DEFAULT_LIVE_SECONDS if duration_seconds is None else duration_seconds
    if not isinstance(dur, (int, float)) or not math.isfinite(dur) or dur <= 0:
        raise ToolFailure("duration_seconds: a positive number of seconds")
    if dur > max_seconds:
        raise ToolFailure(f"duration_seconds: at most {max_seconds:g} s through this server (the call's time "
                          "bound); for longer, run fragscope agent and read its history")
    dur_s, ivl_s = _cli(agent_cmds.sampling_plan, _duration_text(dur, "duration_seconds"),
                        _duration_text(interval_seconds, "interval_seconds"))
    first: dict = {}

    def on_verdict(rep, prog, is_first: bool) -> None:
        if is_first:
            first.update({"after_scrapes": prog.ok_rounds, "elapsed_seconds": round(prog.elapsed_s, 3),
                          "findings": [f"{f.id} ({f.severity.value})" for f in rep.findings],
                          "inconclusive": len(rep.inconclusive)})

    try:
        window, report, prog = agent_cmds.sample_targets([target], dur_s, ivl_s, on_verdict=on_verdict)
    except LiveError as e:
        raise ToolFailure(str(e)) from None
    except ClientError as e:
        raise ToolFailure(str(e)) from None
    ans = _report_answer("diagnose_url", report, {
        "page": target.describe(), "url": target.url, "scrapes": prog.ok_rounds, "rounds": prog.round,
        "sampled_seconds": round(prog.elapsed_s, 3), "first_verdict": first or None})
    return ans


def diagnose_agent(policy: Policy, agent_url: str, since: str | None = None) -> Answer:
    """``diagnose --agent URL --since D``: the sidecar's history, judged with its collector state."""
    full = _url(policy, agent_url)
    return _agent_answer("diagnose_agent", full.rstrip("/"), since)


def _agent_answer(tool: str, base: str, since: str | None) -> Answer:
    from ..agent.client import ClientError, fetch_window
    from ..cli import agent_cmds

    since_s = _cli(agent_cmds.parse_duration_flag, since, "since", "1h")
    try:
        window = fetch_window(base, since_s)
    except ClientError as e:
        raise ToolFailure(str(e)) from None
    report = _cli(agent_cmds.agent_verdict, window, base)
    return _report_answer(tool, report, {"agent": base, "since_seconds": since_s})


def diagnose_fleet(policy: Policy, prometheus_url: str, since: str | None = None, selector: str | None = None,
                   step: str | None = None, triage: str = "auto", peers: int | None = None,
                   deep_limit: int = 20, start: str | None = None, end: str | None = None) -> Answer:
    """``diagnose --prometheus URL``: triage checks in PromQL, then the flagged pods diagnosed in depth."""
    from ..cli.fleet_cmds import fleet_report

    full = _url(policy, prometheus_url)
    if triage not in ("auto", "rules", "queries", "off"):
        raise ToolFailure("triage: one of auto, rules, queries, off")
    if not isinstance(deep_limit, int) or not 1 <= deep_limit <= MAX_DEEP_LIMIT:
        raise ToolFailure(f"deep_limit: 1 to {MAX_DEEP_LIMIT}")
    if peers is not None and not (isinstance(peers, int) and 0 <= peers <= 100):
        raise ToolFailure("peers: 0 to 100")
    opts = {"prometheus": full, "since": since, "selector": selector, "step": step, "triage": triage,
            "peers": peers, "deep_limit": deep_limit, "start": start, "end": end}
    report = _cli(fleet_report, opts)
    doc = _plain(report.to_dict())
    findings, cnj = [], []
    for t in doc.get("targets") or []:
        rep = t.get("report") or {}
        for f in rep.get("findings") or []:
            findings.append({**f, "subject": {"target": t.get("target"), **(f.get("subject") or {})}})
        for i in rep.get("inconclusive") or []:
            cnj.append({**i, "subject": {"target": t.get("target"), **(i.get("subject") or {})}})
        if t.get("error"):
            cnj.append({"id": "target", "missing": [], "reason": t["error"], "subject": {"target": t.get("target")}})
    from ..model import Severity

    findings.sort(key=lambda f: (-Severity(f["severity"]).rank, -(f.get("confidence") or 0)))
    if doc.get("missing_everywhere"):
        cnj.insert(0, {"id": "fleet", "missing": list(doc["missing_everywhere"]),
                       "reason": "missing on every target", "subject": {}})
    tri = doc.get("triage") or {}
    return Answer("diagnose_fleet", doc.get("source") or full, doc, findings, cnj, list(doc.get("notes") or []),
                  {"targets": len(doc.get("targets") or []), "triage": {k: tri.get(k) for k in
                   ("mode", "flagged", "outliers", "examined", "fleet_targets") if k in tri}})


# --- knowledge --------------------------------------------------------------------------------------
def explain_diagnosis(diagnosis_id: str) -> Answer:
    """``diagnose explain ID``: the playbook of a diagnosis."""
    from ..playbooks import PLAYBOOKS, render_playbook_text

    pb = PLAYBOOKS.get(diagnosis_id) if isinstance(diagnosis_id, str) else None
    if pb is None:
        shown = diagnosis_id if isinstance(diagnosis_id, str) else repr(diagnosis_id)
        raise ToolFailure(f"unknown diagnosis {shown[:80]!r}; known: {', '.join(sorted(PLAYBOOKS))}")
    return Answer("explain_diagnosis", diagnosis_id, _plain(pb.to_dict()), text=render_playbook_text(pb))


def known_diagnoses() -> list[str]:
    from ..playbooks import PLAYBOOKS

    return sorted(PLAYBOOKS)
