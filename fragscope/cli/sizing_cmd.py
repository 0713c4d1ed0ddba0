"""``fragscope size --log FILE [--recording FILE]``: what to set, from the engine's own figures (docs/sizing.md)."""
from __future__ import annotations

import json

import click

from .common import EXIT_OK, GibSize, fail
from .kv_budget_cmd import SIZE  # one size type: a bare number is GiB, units honoured (snapshot's parser)

FORMATS = click.Choice(["human", "json"])
from ..units import GiB as GIB


def _runtime_from_recording(path: str) -> dict:
    """Peaks over a whole recording (raises collectors.exposition.ParseError on a bad file)."""
    import math

    from ..collectors.exposition import read_recording
    from ..detectors.frame import build_frame
    from ..signals import VLLM_PREEMPTIONS_BY_REASON
    from ..sizing.runtime import preemptions_by_reason, runtime_from_frame

    window = read_recording(path)
    frame = build_frame(window)
    # every reason by name (kv_full, priority, prefix_cache_reset) where vLLM labels its preemptions
    rt = runtime_from_frame(frame, preemptions_by_reason=preemptions_by_reason(window, VLLM_PREEMPTIONS_BY_REASON) or None)
    if math.isfinite(frame.start):
        rt["window"] = [frame.start, frame.end]
    return rt


def _lines(path: str):
    """The log's lines (.gz too), or one line on stderr and exit 2 (missing, directory, binary, too large)."""
    from ..collectors.enginelog import LogInputError, iter_file_lines

    try:
        lines = iter_file_lines(path)
        first = next(lines, None)
    except LogInputError as e:
        fail(f"size: {path}: {e}")
    if first is None:
        fail(f"size: {path}: empty file")

    def chain():
        yield first
        try:
            yield from lines
        except LogInputError as e:
            fail(f"size: {path}: {e}")
    return chain()


def sizing_text(acc, rt: dict, rec) -> str:
    a = acc
    lines = []
    head = f"engine: {a.engine or 'unknown'}" + (f" {a.version}" if a.version else "")
    if a.failure:
        f = a.failure
        if f["kind"] == "oom" and not f.get("phase"):  # no start-up lines around it: not known to be start-up
            head += f"; an OOM (log line {f.get('line')}), start-up or run time cannot be told"
        else:
            head += f"; start-up FAILED: {f['kind']}" + (f" during {f['phase']}" if f.get("phase") else "") + \
                f" (log line {f.get('line')})"
    elif a.started:
        head += "; started" + (" and served traffic" if a.served else "")
    if a.startups > 1:
        head += f"; {a.startups} start-ups in the log, the last one is used"
    lines.append(head)
    if rec.current:
        lines.append("in force: " + ", ".join(f"{k} {v}" for k, v in rec.current.items()))
    for c in rec.cases:
        lines.append(f"{c['case']}: {c['evidence']}")
        lines.append(f"  change: {c['change']}")
    if rec.settings:
        lines.append("set: " + " ".join(f"{k} {v}" for k, v in rec.settings.items()))
    if rec.alternatives:
        lines.append("or instead: " + " ".join(f"{k} {v}" for k, v in rec.alternatives.items()))
    elif rec.status == "ok":
        lines.append("set: nothing to change" if not rec.missing else "set: nothing can be computed yet")
    if rec.outcome:
        o = rec.outcome
        bits = []
        if o.get("kv_cache_bytes") is not None:
            bits.append(f"KV pool {o['kv_cache_bytes'] / GIB:.2f} GiB")
        if o.get("kv_cache_tokens") is not None:
            bits.append(f"{o['kv_cache_tokens']:,} tokens")
        if o.get("max_concurrency") is not None:
            bits.append(f"{o['max_concurrency']:,} sequences of {o['seq_len_tokens']:,.0f} tokens at once")
        if o.get("max_concurrency_now") is not None:
            bits.append(f"now {o['max_concurrency_now']:,} such sequences")
        if bits:
            lines.append("yields: " + ", ".join(bits))
    if rec.arithmetic:
        lines.append("arithmetic:")
        lines.extend(f"  {i}. {s}" for i, s in enumerate(rec.arithmetic, 1))
    for n in rec.notes:
        lines.append(f"note: {n}")
    for m in rec.missing:
        lines.append(f"to decide, capture: {m}")
    if rec.status == "inconclusive" and not rec.cases:
        lines.append("verdict: inconclusive (see what to capture above)")
    return "\n".join(lines)


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    """Attach ``fragscope size``."""

    @fragscope_group.command("size")
    @click.option("--log", "log_path", required=True, metavar="FILE", type=click.Path(dir_okay=True),
                  help="The engine's log (vLLM V0/V1 or SGLang), from start-up on.")
    @click.option("--recording", metavar="FILE", type=click.Path(dir_okay=True), default=None,
                  help="A recording of the same server under load (KV usage, preemptions, NVML memory).")
    @click.option("--margin-gib", type=GibSize(as_gib=True), default=None, metavar="SIZE",
                  help="Headroom kept free beyond the measured peaks [default: max(0.5 GiB, 2 % of the GPU)].")
    @click.option("--target-concurrency", type=click.IntRange(min=1), default=None, metavar="N",
                  help="Size for N concurrent sequences instead of the observed demand.")
    @click.option("--target-len", type=click.IntRange(min=1), default=None, metavar="TOKENS",
                  help="Sequence length (prompt + output) to size for instead of the observed p95.")
    @click.option("--gpu-memory", type=SIZE, default=None,
                  help="The GPU's memory (e.g. 80GiB) when the log does not print it (vLLM V1 >= 0.10 keeps it at DEBUG).")
    @click.option("--gpu-memory-utilization", "util", type=click.FloatRange(min=0, max=1, min_open=True), default=None,
                  help="The utilization in force when the log does not echo it (no default is assumed).")
    @click.option("--format", "fmt", type=FORMATS, default="human", show_default=True, help="Output format.")
    def size_cmd(log_path, recording, margin_gib, target_concurrency, target_len, gpu_memory, util, fmt):
        """The --gpu-memory-utilization / --mem-fraction-static to set, with the arithmetic shown."""
        acc, rt, rec = size_from_log(log_path, recording, margin_gib, target_concurrency, target_len, gpu_memory, util)
        if fmt == "json":
            click.echo(json.dumps(size_json(acc, rt, rec), indent=2, sort_keys=True, allow_nan=False))
        else:
            click.echo(sizing_text(acc, rt, rec))
        return EXIT_OK


def size_from_log(log_path: str, recording: str | None = None, margin_gib: float | None = None,
                  target_concurrency: int | None = None, target_len: int | None = None,
                  gpu_memory: float | None = None, util: float | None = None):
    """(start-up accounting, runtime peaks, recommendation): what ``fragscope size`` prints.
    ``gpu_memory`` in bytes; ``util`` a ratio; both only where the log does not say."""
    from ..sizing import SizingConfig, parse_startup, recommend

    from ..collectors.enginelog import LogInputError, read_log_file
    from ..sizing.runtime import runtime_from_log_events

    acc = parse_startup(_lines(log_path))
    try:  # second pass: the log's own stats lines (KV usage, queue, preemptions), dated by the file's mtime
        info = read_log_file(log_path)
        events = info.events
    except LogInputError as e:
        fail(f"size: {log_path}: {e}")
    rt: dict = runtime_from_log_events(events, since_line=acc.first_line)
    for name, value in (("total_gpu_memory_bytes", gpu_memory), ("gpu_memory_utilization", util)):
        if value is not None and getattr(acc, name) is None:  # the log's own figure wins
            setattr(acc, name, float(value))
            acc.lines[name] = -2  # given on the command line
    if recording is not None:
        from ..collectors.exposition import ParseError

        try:
            rt.update(_runtime_from_recording(recording))  # the recording wins where both have a value
        except ParseError as e:
            fail(f"size: {e}")
        except OSError as e:
            fail(f"size: cannot read {recording}: {e.strerror or e}")
    cfg = SizingConfig() if margin_gib is None else SizingConfig(margin_min_bytes=margin_gib * GIB, margin_ratio=0.0)
    from ..collectors.enginelog.jobkind import job_kind

    kind = job_kind(info.job_markers, {e.source for e in events})
    rec = recommend(acc, rt, cfg, target_concurrency=target_concurrency, target_len=target_len, job_kind=kind)
    return acc, rt, rec


def size_json(acc, rt: dict, rec) -> dict:
    """``fragscope size --format json``: accounting, runtime, recommendation (strict JSON values)."""
    from ..sizing.arith import nonfinite_as_none

    return nonfinite_as_none({"accounting": acc.to_dict(), "runtime": rt, "recommendation": rec.to_dict()})
