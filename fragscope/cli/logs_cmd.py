"""``diagnose logs FILE`` (engine logs) and ``fragscope capture`` (one capture by hand). docs/logs.md, docs/captures.md."""
from __future__ import annotations

import json
import math
import sys
import time

import click

from .. import ids
from .common import EXIT_OK, ByteSize, Duration, GibSize, fail

FORMATS = click.Choice(["human", "json"])
FAIL_ON = click.Choice(["info", "warning", "critical", "never"])
GIB = 1024.0 ** 3
_DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
                "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "int8": 1}


def _read_log(path: str, tz_offset_hours: float, max_bytes: int):
    """Read and parse FILE, or fail with one line (exit 2) saying what the file is instead."""
    from datetime import timedelta, timezone

    from ..collectors.enginelog import LogInputError, read_log_file
    from ..collectors.enginelog.reader import describe_text

    tz = timezone(timedelta(hours=tz_offset_hours))
    try:
        info = read_log_file(path, tz=tz, max_bytes=max_bytes)
    except LogInputError as e:
        fail(f"{path}: {e}")
    except OSError as e:  # raced away between open and read, I/O error
        fail(f"{path}: cannot read: {e.strerror or e}")
    if info.text_bytes == 0:
        fail(f"{path}: empty file" + (" (after decompression)" if info.compressed else "") + ": nothing to diagnose")
    if not info.events and not info.engine_lines and not _has_startup_accounting(path, max_bytes):
        fail(f"{path}: not an engine log: {describe_text(info.head)}")
    return info


def _has_startup_accounting(path: str, max_bytes: int) -> bool:
    """An excerpt of start-up accounting lines alone (e.g. SGLang's max_total_num_tokens line, vLLM's memory
    summary pasted into a bug report) is still an engine log for the sizing checks."""
    from ..collectors.enginelog.reader import iter_file_lines
    from ..sizing.startup import parse_startup

    try:
        acc = parse_startup(iter_file_lines(path, max_bytes=max_bytes))
    except (OSError, ValueError):
        return False
    d = acc.to_dict() if hasattr(acc, "to_dict") else vars(acc)
    return any(v not in (None, [], {}, "", 0) for k, v in d.items() if k not in ("first_line", "engine", "lines"))


def _capacity_from_accounting(acc) -> dict:
    """``log.kv_capacity`` (the keys of detectors.logs.kv_capacity_summary) from the start-up parser's accounting."""
    tokens = acc.pool_tokens
    if acc.kv_cache_tokens:
        src, key = "logged", "kv_cache_tokens"
    elif acc.gpu_blocks and acc.block_size:
        src, key = "blocks x block_size", "gpu_blocks"
    elif acc.max_total_num_tokens:
        src, key = "logged", "max_total_num_tokens"  # SGLang's pool size in tokens (the contract's values kept)
    else:
        src, key = None, "kv_cache_bytes"
    return {"tokens": tokens, "tokens_source": src, "blocks": acc.gpu_blocks, "cpu_blocks": acc.cpu_blocks,
            "block_size": acc.block_size, "device": "gpu", "max_concurrency": acc.max_concurrency,
            "max_concurrency_tokens_per_request": acc.max_concurrency_tokens_per_request,
            "kv_cache_bytes": acc.kv_cache_bytes, "weights_bytes": acc.weights_bytes,
            "cuda_graph_bytes": acc.cuda_graph_bytes, "non_torch_memory_bytes": acc.non_torch_memory_bytes,
            "peak_torch_memory_bytes": acc.peak_torch_memory_bytes, "activation_peak_bytes": acc.activation_peak_bytes,
            "total_gpu_memory_bytes": acc.total_gpu_memory_bytes, "gpu_memory_utilization": acc.gpu_memory_utilization,
            "line": acc.lines.get(key) or None, "time": None, "text": None, "startups": max(1, acc.startups)}


def _finite(ctx, param, value):
    # click's FloatRange lets NaN through (every comparison with NaN is false) and inf past a min-only range
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value!r} is not a finite number")
    return value


def _tz_offset(ctx, param, value: float) -> float:
    # real UTC offsets run from -12 to +14 hours; NaN and inf pass click's FloatRange, so check here
    if value is None or not math.isfinite(value) or not -14.0 <= value <= 14.0:
        raise click.BadParameter(f"{value!r} is not a UTC offset in hours between -14 and 14")
    return value


def _model_config(path: str) -> dict:
    """Layers, KV heads, head dim and dtype bytes from a Hugging Face config.json (kv-budget's reader)."""
    try:
        from ..kvbudget import KvBudgetError, read_model_config
    except ImportError:
        fail("--model-config needs fragscope.kvbudget (missing in this build); give --num-layers, --num-kv-heads, "
             "--head-dim")
    try:
        shape = read_model_config(path)
    except KvBudgetError as e:
        fail(str(e))
    return {"num_layers": shape.num_layers, "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
            "dtype_bytes": shape.dtype_bytes}


def _estimate(events, opts: dict):
    """(expected tokens, estimate inputs) from the options and what the log says; (None, None) if no check asked."""
    if opts["expected_kv_tokens"] is not None:
        return float(opts["expected_kv_tokens"]), {}
    want = any(opts[k] is not None for k in ("gpu_memory_gib", "model_config", "num_layers"))
    if not want:
        return None, None
    from ..detectors.logs import kv_capacity_summary

    cap = kv_capacity_summary(events) or {}
    model = _model_config(opts["model_config"]) if opts["model_config"] else {}
    for k in ("num_layers", "num_kv_heads", "head_dim"):
        if opts[k] is not None:
            model[k] = opts[k]
    missing = [k for k in ("num_layers", "num_kv_heads", "head_dim") if k not in model]
    if missing:
        fail("the KV check needs the model shape: give --model-config config.json (or --num-layers, --num-kv-heads, "
             "--head-dim)")
    gpu_bytes = opts["gpu_memory_gib"] * GIB if opts["gpu_memory_gib"] is not None else cap.get("total_gpu_memory_bytes")
    if not gpu_bytes:
        fail("the KV check needs --gpu-memory-gib (the log does not say the GPU's memory)")
    util = opts["gpu_memory_utilization"] or cap.get("gpu_memory_utilization") or 0.9  # vLLM's default
    weights = opts["weights_gib"] * GIB if opts["weights_gib"] is not None else cap.get("weights_bytes")
    if weights is None:
        fail("the KV check needs --weights-gib (the log has no 'Loading model weights took' / 'Model loading took' line)")
    kv_dtype = (opts["kv_dtype"] or "auto").lower()
    if kv_dtype == "auto":
        dtype_bytes = model.get("dtype_bytes") or 2  # configs without torch_dtype: vLLM serves them in 16 bits
    else:
        dtype_bytes = _DTYPE_BYTES.get(kv_dtype.replace("torch.", ""))
        if dtype_bytes is None:
            fail(f"unknown --kv-dtype {kv_dtype!r}; use auto, fp16, bf16, fp8 or fp32")
    tp = max(1, opts["tensor_parallel_size"])
    kv_heads = max(1, model["num_kv_heads"] // tp)
    block = opts["block_size"] or cap.get("block_size") or 16
    overhead = (opts["overhead_gib"] or 0.0) * GIB
    inputs = {"gpu_memory_bytes": gpu_bytes, "gpu_memory_utilization": util, "weights_bytes": weights,
              "overhead_bytes": overhead, "block_size": block, "num_layers": model["num_layers"],
              "num_kv_heads": kv_heads, "head_dim": model["head_dim"], "dtype_bytes": dtype_bytes,
              "bytes_per_token": 2.0 * model["num_layers"] * kv_heads * model["head_dim"] * dtype_bytes}
    try:
        from ..kvbudget import kv_budget
    except ImportError:
        fail("kv-budget estimate unavailable in this build (fragscope.kvbudget missing); give --expected-kv-tokens N")
    try:
        est = kv_budget(gpu_memory_bytes=gpu_bytes, gpu_memory_utilization=util, weights_bytes=weights,
                        overhead_bytes=overhead, block_size=block, num_layers=model["num_layers"],
                        num_kv_heads=kv_heads, head_dim=model["head_dim"], dtype_bytes=dtype_bytes)
    except (ValueError, TypeError) as e:
        fail(f"kv-budget: {e}")
    tokens = getattr(est, "cached_tokens", None)
    if tokens is None:
        fail("kv-budget returned no cached_tokens")
    return float(tokens), inputs


def _print_summary(s: dict, out, startup_seen: bool = False) -> None:
    from .render import fmt_ts, fmt_value

    cap = s["kv_capacity"]
    w = out.write
    w(f"\nEngine log: {s['source']}  ({s['events']} events; {', '.join(s['engines']) or 'no engine lines'})\n")
    kind = s.get("job_kind")
    if kind:
        w(f"  Job: {kind}" + (" (no serving engine's own lines: a training loop, a notebook or an application print "
                              "the same PyTorch messages; actions name both kinds of knob)" if kind == "unknown" else "")
          + "\n")
    if cap:
        where = "; ".join(x for x in (cap["tokens_source"] or ("tokens not logged (block size unknown)"
                                                               if cap["blocks"] is not None else None),
                                       f"line {cap['line']}" + (f", {fmt_ts(cap['time'])}" if cap["time"] else "")
                                       if cap["line"] else None) if x)
        w(f"  KV capacity: {fmt_value(cap['tokens'], 'tokens')}" + (f" ({where})" if where else ""))
        if cap["blocks"] is not None:
            w(f", {cap['blocks']} blocks")
        if cap["kv_cache_bytes"]:
            w(f", {fmt_value(cap['kv_cache_bytes'], 'bytes')}")
        if cap["startups"] > 1:
            w(f"; {cap['startups']} startups in this log, the last one shown")
        w("\n")
    else:
        w("  KV capacity: not in this log (" + ("its start-up lines do not size the KV pool" if startup_seen
                                                else "startup lines missing") + ")\n")
    pre = s["preemptions"]
    if pre["count"] is not None:
        rate = f", {pre['rate_per_second']:.2f}/s" if pre["rate_per_second"] is not None else ""
        w(f"  Preemptions: {pre['count']:.0f} ({pre['source']}{rate}) {fmt_ts(pre['first'])} → {fmt_ts(pre['last'])}\n")
    for o in s["ooms"]:
        w(f"  OOM {fmt_ts(o['time'])} line {o['line']} (PyTorch {o['wording']}): asked "
          f"{fmt_value(o['requested_bytes'], 'bytes')}, free {fmt_value(o['free_bytes'], 'bytes')}, reserved-unallocated "
          f"{fmt_value(o['reserved_unallocated_bytes'], 'bytes')}, held outside PyTorch "
          f"{fmt_value(o.get('held_outside_pytorch_bytes'), 'bytes')} → {o['verdict']}"
          + (f" ({o['judged_by']})" if o.get("judged_by") else "") + "\n")
    crash = s.get("crash")
    if crash:
        t = crash["collective_timeouts"]
        hk = crash.get("host_oom_kills") or []
        what = (f"Ray killed {len(hk)} worker(s) for host memory" if crash["cause"] == "host-oom" else
                f"collective timeout ({len(t)} rank/collective(s), first {t[0]['op']} #{t[0]['seq']})" if t else
                f"{crash['engine_dead_count']} line(s) of the engine's own death or failed start"
                if crash["engine_dead_count"] else f"{len(crash['workers_died'])} worker(s) died")
        w(f"  Engine {'failed to start' if crash.get('at_start') else 'died'}: line {crash['first_line']}; {what}; "
          f"cause {crash['cause']}\n")
    st = s["stats"]
    if st["count"]:
        parts = []
        for key, unit in (("requests_running", ""), ("requests_waiting", ""), ("kv_cache_usage_ratio", "ratio"),
                          ("generation_tokens_per_second", "tokens/s")):
            r = st.get(key)
            if r:
                parts.append(f"{key} {fmt_value(r['min'], unit)}–{fmt_value(r['max'], unit)}")
        w(f"  Stats lines: {st['count']}; " + "; ".join(parts) + "\n")
    chk = s["kv_check"]
    if chk:
        w(f"  KV check: logged {chk['logged_tokens']:,.0f} vs estimate {chk['expected_tokens']:,.0f} tokens "
          f"(gap {chk['gap_ratio'] * 100:.1f} %)" + (f", likely {chk['likely_reason']}" if chk["likely_reason"] else "")
          + "\n")
    for n in s.get("notes", []):
        w(f"  note: {n}\n")


@click.command("logs")
@click.argument("file", type=click.Path(dir_okay=True))
@click.option("--format", "fmt", type=FORMATS, default="human", show_default=True, help="Output format.")
@click.option("--fail-on", type=FAIL_ON, default="critical", show_default=True,
              help="Exit 1 when a finding is at or above this severity.")
@click.option("--tz-offset", type=float, default=0.0, show_default=True, callback=_tz_offset,
              help="Hours east of UTC of the log's MM-DD HH:MM:SS timestamps (-14 to 14).")
@click.option("--max-bytes", type=ByteSize(hi=1 << 40), default="512MiB", show_default=True,
              help="Cap on the text read (after decompression of a .gz), e.g. 512MiB; a bigger file is refused.")
@click.option("--expected-kv-tokens", type=click.IntRange(min=1, max=10 ** 12), default=None,
              help="KV capacity to expect, in tokens (skips the kv-budget estimate).")
@click.option("--gpu-memory-gib", type=GibSize(as_gib=True, allow_zero=False), default=None,
              help="GPU memory for the kv-budget estimate: GiB, or a size like 80GiB.")
@click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True), default=None, callback=_finite,
              help="Default: as logged, else 0.9.")
@click.option("--weights-gib", type=GibSize(as_gib=True), default=None, help="GiB or a size. Default: as logged.")
@click.option("--overhead-gib", type=GibSize(as_gib=True), default=None,
              help="Activations, CUDA context, graphs assumed by the estimate, GiB or a size (default 0: the check "
                   "names them).")
@click.option("--model-config", type=click.Path(dir_okay=False), default=None, help="Hugging Face config.json.")
@click.option("--num-layers", type=click.IntRange(min=1, max=100_000), default=None)
@click.option("--num-kv-heads", type=click.IntRange(min=1, max=100_000), default=None)
@click.option("--head-dim", type=click.IntRange(min=1, max=100_000), default=None)
@click.option("--kv-dtype", default=None, help="auto (model dtype), fp16, bf16, fp8, fp32.")
@click.option("--block-size", type=click.IntRange(min=1, max=1 << 20), default=None, help="Default: as logged, else 16.")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1, max=100_000), default=1, show_default=True)
def logs_cmd(file: str, fmt: str, fail_on: str, tz_offset: float, max_bytes: int, **opts) -> int:
    """Diagnose an engine log FILE (vLLM V0/V1, SGLang; PyTorch OOM messages): KV capacity,
    preemptions, OOM fragmentation, stats lines; with model/GPU options, check the KV capacity
    against the kv-budget estimate."""
    from .render import print_report, report_exit_code, json_default

    report, summary, acc = analyse_log_file(file, tz_offset, max_bytes, **opts)
    if fmt == "json":
        sys.stdout.write(json.dumps(log_json(report, summary), indent=2, default=json_default) + "\n")
    else:
        print_report(report, "human")
        _print_summary(summary, sys.stdout, startup_seen=acc is not None and acc.has_accounting)
    return report_exit_code(report, fail_on)


_ESTIMATE_OPTS = ("expected_kv_tokens", "gpu_memory_gib", "gpu_memory_utilization", "weights_gib", "overhead_gib",
                  "model_config", "num_layers", "num_kv_heads", "head_dim", "kv_dtype", "block_size")


def log_json(report, summary: dict) -> dict:
    """``diagnose logs --format json``: the report's fields and ``log`` (the summary)."""
    d = report.to_dict()
    d["log"] = summary
    return d


def _one_sizing_answer(findings, acc, events) -> None:
    """Give the log's findings what the log says is in force (``gpu_memory_utilization``) and the value
    ``fragscope size --log`` computes for this same log (the same call, same inputs), so an action never says
    "not exposed" for a value the log shows, nor a second value of its own for the same flag."""
    if acc is None or not acc.has_accounting:
        return
    from ..sizing import recommend
    from ..sizing.runtime import runtime_from_log_events

    settings = recommend(acc, runtime_from_log_events(events, since_line=acc.first_line)).settings
    for f in findings:
        if acc.gpu_memory_utilization is not None:
            f.context.setdefault("_config", {}).setdefault("gpu_memory_utilization", acc.gpu_memory_utilization)
        if "--gpu-memory-utilization" in settings:
            f.context.setdefault("sized_gpu_memory_utilization", settings["--gpu-memory-utilization"])


def analyse_log_file(file: str, tz_offset: float = 0.0, max_bytes: int = 512 << 20, **opts):
    """(report, log summary, start-up accounting or None) of an engine log FILE: what ``diagnose logs``
    prints. ``opts``: the KV-check options of the command (absent ones are None)."""
    from ..detectors.logs import analyse_log
    from ..model import Inconclusive, Report

    opts = {**{k: None for k in _ESTIMATE_OPTS}, "tensor_parallel_size": 1, **opts}
    info = _read_log(file, tz_offset, max_bytes)
    events = info.events
    expected, inputs = _estimate(events, opts)
    # Sizing from the engine's own start-up accounting (docs/sizing.md): kv-pool-undersized, startup-oom.
    from ..collectors.enginelog.reader import iter_file_lines
    from ..sizing import judge_log

    acc = None
    try:
        acc, judged = judge_log(iter_file_lines(file, max_bytes=max_bytes))
    except (OSError, ValueError):  # read above already; a race or a decode problem leaves sizing out
        judged = []
    summary, findings = analyse_log(events, expected_kv_tokens=expected, estimate_inputs=inputs, source=file,
                                    job_markers=info.job_markers, startup=acc, crash_lines=info.crash_lines)
    summary["input"] = {"lines": info.lines, "engine_lines": info.engine_lines, "undated_lines": info.undated_lines,
                        "truncated_lines": info.truncated_lines, "text_bytes": info.text_bytes,
                        "compressed": info.compressed}
    if info.undated_lines:
        summary["notes"].append(f"{info.undated_lines} line(s) carry a time of day only ([HH:MM:SS]): their dates are "
                                "inferred from the previous dated line or the file's modification time")
    if info.truncated_lines:
        summary["notes"].append(f"{info.truncated_lines} line(s) longer than 64 KiB were cut")
    tr = summary["time_range"]
    start = tr["start"] if tr["start"] is not None else float("nan")
    end = tr["end"] if tr["end"] is not None else float("nan")
    if acc is not None and summary["kv_capacity"] is None and (acc.pool_tokens or acc.kv_cache_bytes):
        # lines only the start-up parser reads (SGLang 'KV Cache is allocated. #tokens' / 'max_total_num_tokens=',
        # V0's profile table): the pool is in this log, not "startup lines missing"
        summary["kv_capacity"] = _capacity_from_accounting(acc)
    if acc is not None and not summary["engines"] and acc.engine:
        summary["engines"] = [acc.engine]
    sized = [x for x in judged if not isinstance(x, Inconclusive)]
    for x in sized:  # the sizing findings' playbooks in the knobs of the job the log shows, as the others'
        x.context.setdefault("job_kind", summary["job_kind"])
    _one_sizing_answer(findings, acc, events)
    findings = list(findings) + sized
    report = Report(window=(start, end), findings=findings, source=file)
    from ..playbooks import attach_playbooks

    attach_playbooks(report)  # findings leave the log detector without a playbook
    if not events and not (acc is not None and acc.has_accounting):  # an engine log without any line read
        report.inconclusive.append(Inconclusive(
            "logs", ["kv_cache_capacity_tokens", "preemptions_total", "kv_cache_usage_ratio"],
            f"{info.engine_lines} engine log line(s) in {file}, none with KV capacity, stats, preemption or OOM "
            "figures (startup lines and stats lines are what the log checks read)"))
    elif summary["preemptions"]["count"] is None and summary["stats"]["count"] \
            and not any(f.id == ids.KV_CACHE_PRESSURE for f in findings):
        report.inconclusive.append(Inconclusive(ids.KV_CACHE_PRESSURE, ["preemptions_total"],
                                                "this log does not report preemptions"))
    report.inconclusive.extend(x for x in judged if isinstance(x, Inconclusive))
    return report, summary, acc


# ---------------------------------------------------------------------------------------------
@click.command("capture")
@click.option("--kind", type=click.Choice(["snapshot", "profile"]), required=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Where captures are kept.")
@click.option("--probe-dir", type=click.Path(file_okay=False), default=None, help="The probe's shared directory.")
@click.option("--vllm", "vllm_urls", multiple=True,
              help="vLLM address, http://host:8000, host:8000 or its /metrics URL (for --kind profile).")
@click.option("--profiler-dir", type=click.Path(file_okay=False), default=None,
              help="vLLM's torch profiler directory (VLLM_TORCH_PROFILER_DIR), as mounted here.")
@click.option("--seconds", type=Duration(hi=600.0), default="5s", show_default=True,
              help="Profile length, e.g. 5s.")
@click.option("--timeout", type=Duration(lo=0.1, hi=600.0), default="30s", show_default=True,
              help="How long to wait for the snapshot or the trace file, e.g. 30s.")
@click.option("--max-bytes", type=ByteSize(), default="2GiB", show_default=True,
              help="Size budget of --out, e.g. 2GiB; the oldest captures beyond it are deleted.")
@click.option("--format", "fmt", type=FORMATS, default="human", show_default=True)
def capture_cmd(kind: str, out_dir: str, probe_dir: str | None, vllm_urls: tuple[str, ...], profiler_dir: str | None,
                seconds: float, timeout: float, max_bytes: int, fmt: str) -> int:
    """Take one capture by hand: a memory snapshot through the probe, or a short vLLM profile."""
    from ..agent.capture import CaptureError, CaptureManager

    if kind == "snapshot" and not probe_dir:
        fail("--kind snapshot needs --probe-dir (the directory the fragscope probe in the engine watches)")
    if kind == "profile" and not vllm_urls:
        fail("--kind profile needs --vllm URL (a server started with VLLM_TORCH_PROFILER_DIR set)")
    from ..collectors.endpoint import EndpointError, base_of, normalise

    try:  # the server's base URL, however it was written (host:port, .../metrics): the profiler paths hang off it
        vllm_urls = tuple(base_of(normalise(u)) for u in vllm_urls)
    except EndpointError as e:
        fail(f"--vllm: {e}")
    try:
        mgr = CaptureManager(out_dir, probe_dir=probe_dir, vllm_urls=vllm_urls, profiler_dir=profiler_dir,
                             profile_seconds=seconds, snapshot_timeout=timeout, trace_timeout=timeout,
                             max_bytes=max_bytes, max_per_hour=None)
        att = mgr.capture(kind, time.time())
    except CaptureError as e:
        fail(str(e))
    if fmt == "json":
        click.echo(json.dumps(att, indent=2, default=str))
    if not att.get("ok"):
        fail(f"{kind} capture failed: {att.get('error') or att.get('verdict')}")
    if fmt != "json":
        click.echo(f"{att['kind']}: {att['verdict']}")
        for p in att.get("paths") or ([att["path"]] if att.get("path") else []):
            click.echo(f"  {p}")
        if att.get("error"):
            click.echo(f"  note: {att['error']}")
    return EXIT_OK


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    diagnose_group.add_command(logs_cmd)
    fragscope_group.add_command(capture_cmd)
