"""``diagnose snapshot FILE``: PyTorch memory snapshot -> allocator numbers, OOM cause, verdict, map.

Contract (flags, JSON fields, diagnosis ids): docs/snapshot.md.
"""
from __future__ import annotations

import math
import os

import click

from .common import EXIT_OK, dumps_json, fail
from ..units import parse_size as _parse_size
from .render import fmt_value

FORMATS = click.Choice(["human", "json"])
FAIL_ON = click.Choice(["info", "warning", "critical", "never"])



def parse_size(text: str) -> int:
    """'80GiB', '81920MiB', '85899345920' -> bytes (binary units; 'GB' is read as GiB): units.parse_size."""
    return _parse_size(text or "", decimal_si=False, allow_zero=True)


def _b(v) -> str:
    return fmt_value(None if v is None else float(v), "bytes")


def _r(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


@click.command("snapshot")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=FORMATS, default="human", show_default=True, help="Output format.")
@click.option("--device", "device", type=int, default=None, help="Only this CUDA device index.")
@click.option("--map/--no-map", "show_map", default=None,
              help="Per-segment map (default: on for human output, off for JSON).")
@click.option("--map-limit", type=click.IntRange(min=0), default=40, show_default=True,
              help="Segments in the map, those with the most free bytes first (0: all).")
@click.option("--device-memory", "device_memory", default=None, metavar="SIZE",
              help="GPU memory size (e.g. 80GiB), to tell OOMs caused by memory outside PyTorch.")
@click.option("--fail-on", type=FAIL_ON, default="critical", show_default=True,
              help="Exit 1 when a finding is at or above this severity.")
@click.option("--html", "html", type=click.Path(dir_okay=False), default=None,
              help="Also write a self-contained HTML report (segment map, findings) to this file.")
@click.option("--max-bytes", "max_bytes", default=None, metavar="SIZE",
              help="Largest snapshot read, file or decompressed (default 256MiB, env "
                   "FRAGSCOPE_SNAPSHOT_MAX_BYTES); loading may take up to 20x this in memory.")
def snapshot_cmd(file: str, fmt: str, device: int | None, show_map: bool | None, map_limit: int,
                 device_memory: str | None, fail_on: str, html: str | None = None,
                 max_bytes: str | None = None) -> int:
    """Analyse a PyTorch memory snapshot FILE (torch.cuda.memory._dump_snapshot pickle, the
    memory_snapshot() segment list, or the same as JSON; .gz too). The file is never executed."""
    from ..detectors.snapshot_map import segment_map_rows
    from ..model import Report
    from .render import report_exit_code

    doc, findings, snap = analyse_snapshot(file, device, device_memory, max_bytes)
    if html:
        from .render import write_snapshot_html
        write_snapshot_html(html, doc, snap, device, map_limit)
    if show_map is None:
        show_map = fmt == "human"
    rows, in_scope = segment_map_rows(snap, device, limit=map_limit or None) if show_map else ([], 0)
    if fmt == "json":
        if show_map:
            doc["segment_map"] = {"legend": _legend(), "segments_in_scope": in_scope, "rows": rows}
        click.echo(dumps_json(doc))
    else:
        _render_human(doc, rows, in_scope, show_map)
    rc = report_exit_code(Report(window=(math.nan, math.nan), findings=findings), fail_on)
    return rc if rc else EXIT_OK


def analyse_snapshot(file: str, device: int | None = None, device_memory: str | None = None,
                     max_bytes: str | None = None):
    """(JSON document, findings, snapshot) of a memory snapshot FILE: what ``diagnose snapshot`` prints."""
    from ..collectors.snapshot import MAX_BYTES_ENV, MAX_SNAPSHOT_BYTES, SnapshotError, read_snapshot
    from ..playbooks.snapshot import diagnose_snapshot

    total = None
    if device_memory is not None:
        try:
            total = parse_size(device_memory)
        except ValueError:
            fail(f"--device-memory {device_memory!r}: not a size (write e.g. 80GiB or 85899345920)")
    cap, cap_from = MAX_SNAPSHOT_BYTES, None
    if max_bytes is not None:
        cap_from = ("--max-bytes", max_bytes)
    elif os.environ.get(MAX_BYTES_ENV):
        cap_from = (MAX_BYTES_ENV, os.environ[MAX_BYTES_ENV])
    if cap_from is not None:
        try:
            cap = parse_size(cap_from[1])
        except ValueError:
            cap = 0
        if cap <= 0:
            fail(f"{cap_from[0]} {cap_from[1]!r}: not a positive size (write e.g. 512MiB or 536870912)")
    try:
        snap = read_snapshot(file, max_bytes=cap)
    except SnapshotError as e:
        fail(str(e))
    except MemoryError:
        fail(f"cannot read {file}: out of memory")
    if device is not None and device not in snap.devices():
        have = ", ".join(str(d) for d in snap.devices()) or "none"
        fail(f"{file}: no device {device} in this snapshot (devices present: {have})")
    doc, findings = diagnose_snapshot(snap, device=device, device_total_bytes=total)
    return doc, findings, snap


def _legend() -> dict:
    from ..detectors.snapshot_map import MAP_CHARS

    return {"allocated": MAP_CHARS["allocated"], "rounding_waste": MAP_CHARS["waste"],
            "pending_free": MAP_CHARS["pending"], "free": MAP_CHARS["free"],
            "mixed_used_and_free": MAP_CHARS["mixed"]}


def _render_human(doc: dict, rows: list[dict], in_scope: int, show_map: bool) -> None:
    out = click.echo
    f = doc["format"]
    out(f"fragscope memory snapshot: {doc['source']}  ({f['container']}, {f['layout']}"
        f"{', legacy' if f['legacy'] else ''}; {doc['segment_count']} segments, {doc['block_count']} blocks)")
    s = doc["allocator_settings"]
    if s["known"]:
        exp = {True: "on", False: "off", None: "?"}[s["expandable_segments"]]
        mss = _b(s["max_split_size_bytes"]) if s["max_split_size_bytes"] is not None else "unlimited"
        gct = s["garbage_collection_threshold"]
        out(f"allocator: backend {s['backend'] or '?'}, expandable_segments {exp}, max_split_size {mss}, "
            f"garbage_collection_threshold {gct if gct is not None else '?'}, "
            f"PYTORCH_CUDA_ALLOC_CONF={s['alloc_conf']!r}")
    else:
        out("allocator settings: not recorded in this snapshot (older PyTorch)")
    j = doc["job"]
    out(f"job: {j['kind']}" + (f" ({'; '.join(j['evidence'])})" if j["evidence"] else "")
        + (f": {j['note']}" if j["note"] else ""))
    out(f"verdict: {doc['verdict']}")
    for d in doc["devices"]:
        out("")
        out(f"GPU {d['device']}  verdict {d['verdict']}")
        req = _b(d["requested_bytes"])
        out(f"  reserved {_b(d['reserved_bytes'])}   allocated {_b(d['allocated_bytes'])}   requested {req}"
            f"   rounding waste {_b(d['internal_waste_bytes'])}   pending free {_b(d['active_pending_free_bytes'])}")
        out(f"  free in segments {_b(d['inactive_bytes'])} in {d['free_blocks']} blocks, largest "
            f"{_b(d['largest_free_block_bytes'])}, external fragmentation {_r(d['external_fragmentation'])}")
        out(f"  empty_cache() could return {_b(d['releasable_bytes'])}; stuck beside live tensors "
            f"{_b(d['non_releasable_inactive_bytes'])}; private pools {_b(d['private_pool_bytes'])}; "
            f"slivers {d['sliver_count']} ({_b(d['sliver_bytes'])}); expandable segments {d['expandable_segments']}")
        out(f"  {'pool':<14}{'stream':>16}{'reserved':>13}{'allocated':>13}{'free':>13}{'largest free':>14}"
            f"{'ext.frag':>9}{'segments':>9}")
        for r in d["streams"]:
            pool = "default" if r["pool_id"] == [0, 0] else f"private {r['pool_id'][0]},{r['pool_id'][1]}"
            out(f"  {pool:<14}{r['stream']:>16}{_b(r['reserved_bytes']):>13}{_b(r['allocated_bytes']):>13}"
                f"{_b(r['inactive_bytes']):>13}{_b(r['largest_free_block_bytes']):>14}"
                f"{_r(r['external_fragmentation']):>9}{r['segments']:>9}")
        for o in d["ooms"]:
            out(f"  OOM: {_b(o['size_bytes'])} on stream {o['stream']}, device free {_b(o['device_free_bytes'])}"
                f" -> {o['classification']}: {o['reason']}")
            out(f"       {_oom_state_line(o)}")
            for a in o["replay_assumptions"]:
                out(f"       assumed: {a}")
        if d["trace_actions"]:
            out("  trace: " + ", ".join(f"{k} {v}" for k, v in d["trace_actions"].items()))
    h = doc["host"]
    if h["recorded"]:
        out("")
        if h["reserved_bytes"] is None:
            out(f"pinned host memory: recorded ({h['segments']} segments read, {h['trace_entries']} trace entries), "
                f"but {h['reason']}")
        else:
            out(f"pinned host memory (CachingHostAllocator): reserved {_b(h['reserved_bytes'])}   allocated "
                f"{_b(h['allocated_bytes'])}   pending free {_b(h['active_pending_free_bytes'])}   free "
                f"{_b(h['inactive_bytes'])} in {h['segments']} segments, {h['blocks']} blocks")
        if h["trace_actions"]:
            out("  host trace: " + ", ".join(f"{k} {v}" for k, v in h["trace_actions"].items()))
    for i, fd in enumerate(doc["findings"], 1):
        subject = " ".join(f"{k}={v}" for k, v in fd["subject"].items())
        out("")
        out(f"{i}. {fd['severity'].upper()} {fd['id']}  confidence {fd['confidence']:.2f}  {subject}")
        out(f"   {fd['summary']}")
        for e in fd["evidence"]:
            mark = "+" if e["agrees"] else "-"
            thr = f" threshold {fmt_value(e['threshold'], e['unit'])}" if e["threshold"] is not None else ""
            note = f" — {e['note']}" if e["note"] else ""
            out(f"   {mark} {e['signal']}: {fmt_value(e['observed'], e['unit'])}{thr}{note}")
        if fd["missing"]:
            out(f"   missing to be sure: {', '.join(fd['missing'])}")
        pb = fd["playbook"] or {}
        for line in pb.get("immediate", []):
            out(f"   now: {line}")
        for a in pb.get("actions", []):
            if not a.startswith("set PYTORCH_CUDA_ALLOC_CONF="):  # those are listed with their options
                out(f"   fix: {a}")
        for o in pb.get("options", []):
            verb = {True: "fix", False: "skip", None: "maybe"}[o["applies"]]
            out(f"   {verb}: PYTORCH_CUDA_ALLOC_CONF={o['setting']} [{o['status']}]: {o['why']}")
            for c in o["preconditions"]:
                out(f"       needs: {c}")
            for c in o["contraindications"]:
                out(f"       not if: {c}")
    for inc in doc["inconclusive"]:
        out("")
        out(f"could not judge {inc['id']}: {inc['reason']}")
    if doc["notes"]:
        out("")
        for n in doc["notes"]:
            out(f"note: {n}")
    if show_map and rows:
        out("")
        shown = f"{len(rows)} of {in_scope}, most free first" if len(rows) < in_scope else f"{len(rows)}"
        out(f"Segment map ({shown}); one character = 1/{len(rows[0]['map'])} of the segment: "
            f"# allocated  + rounding waste  ~ pending free  . free  : used and free")
        for r in rows:
            pool = "" if r["pool_id"] == [0, 0] else f" pool {r['pool_id'][0]},{r['pool_id'][1]}"
            kind = ("exp " if r["is_expandable"] else "") + r["segment_type"]
            out(f"  gpu{r['device']} {r['address']:#014x} {_b(r['total_size']):>10} {kind:<9} s{r['stream']}"
                f"{pool} [{r['map']}] free {_b(r['inactive_bytes'])} in {r['free_blocks']}")


def _oom_state_line(o: dict) -> str:
    """Which state the OOM was judged on, and how far the replay got."""
    if o["state_at"] == "dump":
        return (f"judged on the dump-time state (stale): the replay stopped after undoing "
                f"{o['replayed_entries']} of {o['entries_after']} later trace entries: {o['replay_problem']}")
    if not o["replayed_entries"]:
        return "judged on the state at the OOM (no trace entries after it)"
    line = f"judged on the state at the OOM, rebuilt by undoing the {o['replayed_entries']} trace entries after it"
    dump_cls = o["at_dump"]["classification"]
    if dump_cls != o["classification"]:
        line += f"; the dump-time state alone would read {dump_cls}"
    if o["replay_uncertain_bytes"]:
        line += f"; up to {_b(o['replay_uncertain_bytes'])} of the free space may be unsplit block tails"
    return line


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    """Attach ``snapshot`` to the ``diagnose`` group (``fragscope diagnose snapshot`` follows)."""
    diagnose_group.add_command(snapshot_cmd)
