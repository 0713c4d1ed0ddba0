"""The HTML page of a memory-snapshot analysis (``diagnose snapshot --html``): allocator settings, the
devices with their OOMs, the per-segment map, and the findings."""
from __future__ import annotations

from .fmt import fmt_value
from .page import header, page
from .sections import findings_section, rank_findings_dicts, summary_table
from .svg import esc, segment_map

def render_snapshot_html(doc: dict, map_rows: list[dict], segments_in_scope: int, *,
                         generated_at: float | None = None) -> str:
    """A memory-snapshot analysis (fragscope.playbooks.snapshot.diagnose_snapshot) with its per-segment map
    (``map_rows`` from segment_map_rows)."""
    f = doc.get("format") or {}
    extra = (f"{esc(f.get('container', ''))}, {esc(f.get('layout', ''))} · {esc(doc.get('segment_count'))} segments, "
             f"{esc(doc.get('block_count'))} blocks · verdict <b>{esc(doc.get('verdict'))}</b>")
    body = [header("memory snapshot", doc.get("source", ""), None, extra, generated_at)]
    findings = [x for x in rank_findings_dicts(doc.get("findings") or [])]
    body.append(summary_table(findings))
    s = doc.get("allocator_settings") or {}
    if s.get("known"):
        body.append(f"<p>Allocator: backend {esc(s.get('backend') or '?')}, expandable_segments "
                    f"{esc({True: 'on', False: 'off'}.get(s.get('expandable_segments'), '?'))}, "
                    f"PYTORCH_CUDA_ALLOC_CONF=<code>{esc(repr(s.get('alloc_conf')))}</code></p>")
    else:
        body.append('<p class="small">Allocator settings: not recorded in this snapshot (older PyTorch).</p>')
    job = doc.get("job")
    if isinstance(job, dict):  # what took the snapshot, from its stack frames: the fixes name its settings
        told = "; ".join(str(e) for e in job.get("evidence") or []) or job.get("note") or ""
        body.append(f"<p>Job: <b>{esc(job.get('kind'))}</b>{(' (' + esc(told) + ')') if told else ''}</p>")
    devs = doc.get("devices") or []
    if devs:
        body.append("<h2>Devices</h2><table><thead><tr><th>GPU</th><th>verdict</th><th>reserved</th><th>allocated</th>"
                    "<th>free in segments</th><th>largest free</th><th>external fragmentation</th>"
                    "<th>empty_cache() returns</th><th>stuck beside live tensors</th></tr></thead><tbody>")
        for d in devs:
            body.append(f"<tr><td>{esc(d.get('device'))}</td><td>{esc(d.get('verdict'))}</td>"
                        + "".join(f"<td class=\"num\">{esc(fmt_value(d.get(k), 'bytes'))}</td>" for k in
                                  ("reserved_bytes", "allocated_bytes", "inactive_bytes", "largest_free_block_bytes"))
                        + f"<td class=\"num\">{esc(fmt_value(d.get('external_fragmentation'), 'ratio'))}</td>"
                        + "".join(f"<td class=\"num\">{esc(fmt_value(d.get(k), 'bytes'))}</td>" for k in
                                  ("releasable_bytes", "non_releasable_inactive_bytes")) + "</tr>")
            for o in d.get("ooms") or []:
                body.append(f"<tr><td></td><td colspan=\"8\">OOM: {esc(fmt_value(o.get('size_bytes'), 'bytes'))} "
                            f"on stream {esc(o.get('stream'))} → <b>{esc(o.get('classification'))}</b>: "
                            f"{esc(o.get('reason'))}</td></tr>")
        body.append("</tbody></table>")
    body.append("<h2>Segment map</h2>")
    if map_rows:
        shown = (f"{len(map_rows)} of {segments_in_scope} segments, those with the most free bytes"
                 if len(map_rows) < segments_in_scope else f"all {len(map_rows)} segments")
        cells = len(str(map_rows[0].get("map") or "")) or 1
        from .svg import MAP_COLOURS

        body.append('<div class="legend">' + "".join(
            f'<span><i class="sw box" style="background:{c};outline:1px solid #bbb"></i>{esc(n)}</span>'
            for k, (n, c) in MAP_COLOURS.items() if k != " ") + "</div>")
        body.append(f'<p class="small">{esc(shown)}, in address order; each bar is one segment (not to scale '
                    f'between segments), one cell = 1/{cells} of it.</p>')
        body.append(segment_map(map_rows, "Allocator segments", chart_id="chart-segments"))
    else:
        body.append('<p class="absent">No segments in scope.</p>')
    body += findings_section(findings, doc.get("inconclusive") or [], list(doc.get("notes") or []))
    return page(f"fragscope snapshot: {doc.get('source', '')}", body)
