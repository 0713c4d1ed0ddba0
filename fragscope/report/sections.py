"""The findings part of every HTML report: the ranked summary table, each finding with its evidence
table and playbook, what could not be judged, and the notes."""
from __future__ import annotations

from .fmt import fmt_clock, fmt_ts, fmt_value
from .playbook_html import playbook_section
from .svg import esc

def _subject(d: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in (d or {}).items())

def summary_table(findings: list[dict]) -> str:
    """The ranked table of findings, each linking to its section; "" when there is none."""
    if not findings:
        return ""
    rows = []
    for i, f in enumerate(findings, 1):
        sev = str(f.get("severity", ""))
        rows.append(f'<tr><td class="num">{i}</td><td><span class="sev sev-{esc(sev)}">{esc(sev.upper())}</span></td>'
                    f'<td><a href="#finding-{i}">{esc(f.get("id"))}</a></td>'
                    f'<td class="num">{_conf(f.get("confidence"))}</td><td>{esc(_subject(f.get("subject")))}</td>'
                    f'<td>{esc(fmt_ts(f.get("onset")))}</td></tr>')
    return ("<table class=\"ranked\"><thead><tr><th>#</th><th>severity</th><th>diagnosis</th><th>confidence</th>"
            "<th>subject</th><th>onset</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")

def _conf(c) -> str:
    try:
        return f"{float(c):.2f}"
    except (TypeError, ValueError):
        return "?"

def _evidence_table(evidence: list[dict]) -> str:
    """One row per evidence; the baseline / threshold / window columns only when some row has one."""
    if not evidence:
        return ""
    cols = [("baseline", "baseline"), ("threshold", "threshold"), ("window", "window (UTC)")]
    cols = [(k, h) for k, h in cols if any(e.get(k) is not None for e in evidence)]
    rows = []
    for e in evidence:
        unit = e.get("unit") or ""
        mark = '<span class="agree" title="agrees">+</span>' if e.get("agrees", True) else \
            '<span class="against" title="speaks against">−</span>'
        cells = []
        for k, _ in cols:
            v = e.get(k)
            if k == "window":
                txt = ""
                if isinstance(v, dict) and v.get("start") is not None and v.get("end") is not None:
                    txt = f"{fmt_clock(v['start'])}–{fmt_clock(v['end'])}"
            else:
                txt = fmt_value(v, unit) if v is not None else ""
            cells.append(f'<td class="num">{esc(txt)}</td>')
        rows.append(f"<tr><td>{mark}</td><td>{esc(e.get('signal'))}</td>"
                    f"<td class=\"num\">{esc(fmt_value(e.get('observed'), unit))}</td>{''.join(cells)}"
                    f"<td>{esc(e.get('note') or '')}</td></tr>")
    head = "".join(f"<th>{esc(h)}</th>" for _, h in cols)
    return ("<table class=\"evidence\"><thead><tr><th title=\"+ agrees with the diagnosis, − checked and speaks "
            f"against it\">±</th><th>signal</th><th>observed</th>{head}<th>note</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


_BASIS = {"change": "a change against the window's baseline", "level": "judged on the present level",
          "snapshot": "from a memory snapshot", "trace": "from a kernel trace", "log": "from engine logs"}


def _finding(i: int, f: dict) -> str:
    sev = str(f.get("severity", "info"))
    subj = _subject(f.get("subject"))
    head = (f'<span class="sev sev-{esc(sev)}">{esc(sev.upper())}</span> <b>{esc(f.get("id"))}</b> · confidence '
            f'{_conf(f.get("confidence"))}{(" · " + esc(subj)) if subj else ""} · '
            f'onset {esc(fmt_ts(f.get("onset")))}')
    basis = _BASIS.get(str(f.get("basis")))
    if basis:
        head += f' · <span class="small">{esc(basis)}</span>'
    parts = [f'<article class="finding {esc(sev)}" id="finding-{i}"><h3>{i}. {head}</h3>',
             f"<p>{esc(f.get('summary', ''))}</p>", _evidence_table(f.get("evidence") or [])]
    if f.get("missing"):
        parts.append(f"<p class=\"small\">Missing to be sure: {esc(', '.join(map(str, f['missing'])))}</p>")
    for att in f.get("attachments") or []:
        if isinstance(att, dict):
            parts.append(f"<p class=\"small\">Attached {esc(att.get('kind', 'evidence'))}: "
                         f"{esc(att.get('verdict') or '')} {esc(att.get('summary') or '')}</p>")
    parts.append(playbook_section(f))
    parts.append("</article>")
    return "".join(parts)

def findings_section(findings: list[dict], inconclusive: list[dict], notes: list[str],
                     judged: bool = True) -> list[str]:
    """Findings (or "No finding." / "Not judged yet."), then what could not be judged, then the notes."""
    out = ["<h2>Findings</h2>"]
    if not judged:
        out.append("<p><b>Not judged yet.</b> The detectors have not run on this window.</p>")
    elif not findings:
        out.append("<p><b>No finding.</b>" + (" Some detectors could not judge (below): this is not a clean bill of "
                                              "health.</p>" if inconclusive else "</p>"))
    else:
        out.append('<p class="small">In evidence tables <span class="agree">+</span> marks a signal that agrees '
                   'with the diagnosis and <span class="against">−</span> one that was checked and speaks against '
                   'it.</p>')
    out += [_finding(i, f) for i, f in enumerate(findings, 1)]
    if inconclusive:
        out.append("<h2>Could not judge</h2><p class=\"small\">Not healthy, just not enough data.</p><table>"
                   "<thead><tr><th>diagnosis</th><th>reason</th><th>missing</th></tr></thead><tbody>")
        for inc in inconclusive:
            out.append(f"<tr><td>{esc(inc.get('id'))}</td><td>{esc(inc.get('reason', ''))}</td>"
                       f"<td>{esc(', '.join(map(str, inc.get('missing') or [])))}</td></tr>")
        out.append("</tbody></table>")
    if notes:
        out.append("<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    return out

def rank_findings_dicts(fs: list[dict]) -> list[dict]:
    """Findings in ``to_dict`` form, worst first: severity, then confidence, then id."""
    rank = {"critical": 2, "warning": 1, "info": 0}
    return sorted(fs, key=lambda f: (-rank.get(f.get("severity"), 0), -float(f.get("confidence") or 0),
                                     str(f.get("id"))))
