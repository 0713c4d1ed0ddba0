"""``diagnose ort-profile FILE`` (cpu-fallback) and ``diagnose triton-batching SCRAPE... --config
config.pbtxt`` (batching-misconfiguration): engine verdicts from artefacts beside /metrics (docs/engines.md)."""
from __future__ import annotations

import json
import math
import sys
import time

import click

from ..model import Inconclusive, Report
from .common import Duration, json_safe, fail
from .render import render_human, report_exit_code

FORMATS = click.Choice(["human", "json"])
FAIL_ON = click.Choice(["info", "warning", "critical", "never"])


def _emit(report: Report, fmt: str, fail_on: str, extra: dict) -> int:
    if fmt == "json":
        out = report.to_dict()
        out.update(extra)
        sys.stdout.write(json.dumps(json_safe(out), indent=2, allow_nan=False) + "\n")
    else:
        render_human(report, sys.stdout)
    return report_exit_code(report, fail_on)


@click.command("ort-profile")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=FORMATS, default="human", show_default=True, help="Output format.")
@click.option("--fail-on", type=FAIL_ON, default="critical", show_default=True,
              help="Exit 1 when a finding is at or above this severity.")
def ort_profile_cmd(file: str, fmt: str, fail_on: str) -> int:
    """Which ONNX Runtime operators fell back to the CPU, from a profile written with
    SessionOptions.enable_profiling (JSON, or .json.gz) or a session log at VERBOSE severity
    (log_severity_level=0: the node placement report, without timings)."""
    from ..collectors.ort_profile import Placement, ProfileError, read_input
    from ..detectors import cpu_fallback
    from ..playbooks import attach_playbooks

    try:
        prof = read_input(file)
    except ProfileError as e:
        fail(str(e))
    res = cpu_fallback.detect_placement(prof) if isinstance(prof, Placement) else cpu_fallback.detect(prof)
    report = Report(window=(math.nan, math.nan), source=file)
    if isinstance(res, Inconclusive):
        report.inconclusive.append(res)
    else:
        report.findings = res
    attach_playbooks(report)
    if isinstance(prof, Placement):
        return _emit(report, fmt, fail_on, {"placement": {
            "nodes_per_provider": prof.counts, "cpu_nodes": [f"{op} ({n})" if n else op
                                                             for op, n in prof.nodes.get(cpu_fallback.CPU, [])],
            "kernel_not_found": [f"{op} ({n})" for op, n in prof.not_found],
            "copies_added": [f"{k} {t} for {p}" for k, t, p in prof.copies_added]}})
    a = cpu_fallback.analyse(prof)
    r = a["median_run"] or {}
    extra = {"profile": {"runs": a["runs"], "providers": a["providers"], "cpu_ops": a["cpu_ops"],
                         "cpu_op_seconds_per_run": {k: v * 1e-6 for k, v in a["cpu_op_us_per_run"].items()},
                         "shape_nodes_on_cpu": a["shape_nodes"],
                         "median_run": {"boundaries": r.get("boundaries"), "partitions": r.get("partitions"),
                                        "copies": r.get("copies"),
                                        "copy_seconds": (r["copy_us"] * 1e-6) if r else None,
                                        "run_seconds": (r["run_us"] * 1e-6) if r else None},
                         "notes": prof.notes}}
    return _emit(report, fmt, fail_on, extra)


@click.command("triton-batching")
@click.argument("scrapes", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--url", default=None, help="Scrape Triton's /metrics (e.g. http://host:8002/metrics) twice, "
              "--interval seconds apart (default 30), instead of reading SCRAPES.")
@click.option("--config", "config", required=True, type=click.Path(dir_okay=False),
              help="The model's config.pbtxt.")
@click.option("--model", default=None, help="The model label in the scrape (default: the config's name, or the "
              "only model in the scrape).")
@click.option("--interval", type=Duration(hi=3600.0), default=None,
              help="Time between the SCRAPES when they carry no timestamps (two scrapes give rates), e.g. 30s; "
                   "with --url, between the live scrapes [default: 30s].")
@click.option("--format", "fmt", type=FORMATS, default="human", show_default=True, help="Output format.")
@click.option("--fail-on", type=FAIL_ON, default="critical", show_default=True,
              help="Exit 1 when a finding is at or above this severity.")
def triton_batching_cmd(scrapes: tuple[str, ...], url: str | None, config: str, model: str | None,
                        interval: float | None, fmt: str, fail_on: str) -> int:
    """Judge a Triton model's dynamic-batching settings (config.pbtxt) against its counters in one or
    more /metrics scrapes (port 8002): fill, queue vs compute time, instance utilisation."""
    report, extra = triton_batching_report(scrapes, url, config, model, interval)
    return _emit(report, fmt, fail_on, extra)


def triton_batching_report(scrapes: tuple[str, ...], url: str | None, config: str, model: str | None = None,
                           interval: float | None = None) -> tuple[Report, dict]:
    """(report, the JSON's extra keys) of ``diagnose triton-batching``: what it prints."""
    from ..collectors.triton_config import ConfigError, read_config
    from ..detectors import batching

    from ..collectors.inputs import InputError, read_bytes

    try:
        cfg = read_config(read_bytes(config, 1024 * 1024, "config.pbtxt").decode("utf-8"))
    except InputError as e:
        fail(str(e))
    except UnicodeDecodeError as e:
        fail(f"{config}: cannot read: not UTF-8 text ({str(e)[:80]})")
    except ConfigError as e:
        fail(f"{config}: {e}")
    w = _scrapes_window(scrapes, url, interval, count=2)
    scrapes = (url,) if url else scrapes
    models = batching.models_in(w)
    if model is None and cfg.name and cfg.name not in models:
        # the config is another model's: judging its batching settings against these counters would mix two
        # models (densenet_onnx's config against resnet50_trt's executions), so ask instead of guessing
        fail(f"{config} configures model {cfg.name!r}, which the scrape does not have (it has "
             f"{', '.join(models) or 'no Triton model counters'}); give --model NAME to judge this config against "
             "another model's counters")
    name = model or (cfg.name if cfg.name in models else (models[0] if len(models) == 1 else None))
    if name is None:
        fail(f"which model? the scrape has {', '.join(models) or 'no Triton model counters'}; give --model")
    res = batching.detect(cfg, batching.model_counters(w, name))
    report = Report(window=(w.start, w.end), source=",".join(scrapes))
    if isinstance(res, Inconclusive):
        report.inconclusive.append(res)
    else:
        for f in res:
            pb = batching.PLAYBOOK.to_dict()
            pb["actions"] = batching.actions(f.context, {})
            f.playbook = pb
        report.findings = res
    return report, {"triton_config": cfg.to_dict(), "model": name}


def _scrapes_window(scrapes: tuple[str, ...], url: str | None, interval: float | None, count: int):
    """Scrape files (unstamped: taken --interval apart, ending now; or with their own timestamps), or
    ``count`` live scrapes of ``url`` --interval apart (default 30 s) -> one Window."""
    from ..collectors.exposition import ParseError, parse_file, parse_text
    from ..model import Window

    if bool(url) == bool(scrapes):
        fail("give SCRAPE files or --url, one of the two")
    texts: list[tuple[str, str | None]] = [(p, None) for p in scrapes]
    if url:
        from ..collectors.endpoint import EndpointError, resolve
        from ..collectors.http import FetchError, http_get

        interval = 30.0 if interval is None else interval
        if not 0 < interval <= 3600:
            fail(f"--interval {interval:g}s: give a duration between 0 and 1h")
        try:  # the page behind the URL (/metrics for a server's address; Triton's 8002), as everywhere
            found = resolve(url)
        except EndpointError as e:
            fail(str(e))
        url = found.url
        texts = [(url, found.first_text)]
        for i in range(1, count):
            time.sleep(interval)
            try:
                texts.append((url, http_get(url, timeout_s=10.0)))
            except FetchError as e:
                fail(str(e))
        scrapes = (url,)
    stamped = len(texts) > 1 and interval is None  # each scrape must then carry its own timestamps
    base = time.time() - (len(texts) - 1) * (interval or 0.0)
    cols: dict = {}
    types: dict = {}
    for i, (path, text) in enumerate(texts):
        try:
            ts = None if stamped else base + float(i) * (interval or 0.0)
            # files through the one reader (regular file, decompression and line caps), pages as fetched
            p = parse_file(path, ts) if text is None else parse_text(text, default_ts=ts, source=path)
        except FileNotFoundError:
            fail(f"{path}: no such file")
        except IsADirectoryError:
            fail(f"{path}: is a directory")
        except (OSError, UnicodeDecodeError) as e:
            fail(f"{path}: cannot read: {str(e).splitlines()[0]}")
        except ParseError as e:
            fail(str(e) + (" (several scrapes without timestamps: give --interval SECONDS)" if stamped else ""))
        types.update(p.types)
        for k, (ts, vs) in p.cols.items():
            a = cols.setdefault(k, ([], []))
            a[0].extend(ts)
            a[1].extend(vs)
    w = Window.from_columns(cols, types=types, source=",".join(scrapes))
    if not math.isfinite(w.start):
        fail(f"{','.join(scrapes)}: no finite sample values")
    return w


@click.command("scrape")
@click.argument("scrapes", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--url", default=None, help="Scrape this /metrics (any engine: vLLM, SGLang, TGI, Triton, "
              "TensorRT-LLM) --count times, --interval seconds apart, instead of reading SCRAPES.")
@click.option("--interval", type=Duration(hi=3600.0), default=None,
              help="Time between scrapes, e.g. 30s (SCRAPES without timestamps, or --url) [default with --url: 30s].")
@click.option("--count", type=click.IntRange(1, 20), default=1, show_default=True, help="Live scrapes with --url.")
@click.option("--format", "fmt", type=FORMATS, default="human", show_default=True, help="Output format.")
@click.option("--fail-on", type=FAIL_ON, default="critical", show_default=True,
              help="Exit 1 when a finding is at or above this severity.")
def scrape_cmd(scrapes: tuple[str, ...], url: str | None, interval: float | None, count: int, fmt: str,
               fail_on: str) -> int:
    """Diagnose one or a few plain /metrics scrapes of any supported engine (docs/engines.md): judged on
    the present state, counters as lifetime totals from one scrape, rates from two or more."""
    from ..collectors.engines import derive
    from ..pipeline import diagnose

    w = derive(_scrapes_window(scrapes, url, interval, count))
    report = diagnose(w)
    return _emit(report, fmt, fail_on, {})


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    diagnose_group.add_command(ort_profile_cmd)
    diagnose_group.add_command(triton_batching_cmd)
    diagnose_group.add_command(scrape_cmd)
