"""A finding's playbook in HTML: what to do now, the fixes computed from the incident, allocator
settings with their preconditions, and the shell-ready snippets (commands, flags, env) each action names."""
from __future__ import annotations

import re

from .svg import esc

# Commands ready to copy, taken from a playbook action's text
_ENV_RE = re.compile(r"\b(PYTORCH_(?:CUDA_)?ALLOC_CONF=[A-Za-z0-9_:.,]+[A-Za-z0-9_])")
_NUM = r"[0-9]+(?:\.[0-9]+)?"
_FLAG_TO_RE = re.compile(rf"(--[a-z][a-z0-9-]+) ({_NUM}) → ({_NUM})(?![0-9.]* ?[A-Za-z])")
_FLAG_RE = re.compile(r"(--[a-z][a-z0-9-]+) ([0-9][0-9.]*[0-9]|[0-9])(?![0-9.]* ?(?:→|[A-Za-z%]))")
_CMD_RE = re.compile(r"\(((?:nvidia-smi|fragscope|diagnose|nsys|kubectl) [^()]+?)\)")


def copy_snippets(text: str) -> list[str]:
    """Shell-ready pieces of an action: ``export PYTORCH_CUDA_ALLOC_CONF=...``, an engine flag with
    its new value (``--gpu-memory-utilization 0.85``; for ``--x 0.90 → 0.93`` the target), or a command
    the text names in parentheses (``nvidia-smi -q -d POWER``)."""
    out: list[str] = []
    for m in _ENV_RE.finditer(text):
        out.append(f"export {m.group(1)}")
    for m in _FLAG_TO_RE.finditer(text):
        out.append(f"{m.group(1)} {m.group(3)}")
    for m in _FLAG_RE.finditer(text):
        if any(s.startswith(m.group(1) + " ") for s in out):
            continue
        out.append(f"{m.group(1)} {m.group(2)}")
    for m in _CMD_RE.finditer(text):
        out.append(m.group(1).strip())
    seen: set[str] = set()
    return [s for s in out if not (s in seen or seen.add(s))]

def dedupe(items) -> list:
    """``items`` without repeats, first kept (None: empty)."""
    seen: set = set()
    out = []
    for x in items or []:
        k = x if isinstance(x, str) else repr(x)
        if k in seen:
            continue
        seen.add(k)
        out.append(x)
    return out

def _text_with_cmds(text: str) -> str:
    snips = copy_snippets(text)
    extra = "".join(f' <code class="cmd">{esc(s)}</code>' for s in snips)
    return f"{esc(text)}{('<br>' + extra) if extra else ''}"

def playbook_section(f: dict) -> str:
    """The playbook of finding ``f`` (its ``to_dict`` form) as HTML; "" when it has none."""
    pb = f.get("playbook") or {}
    if not isinstance(pb, dict) or not pb:
        return ""
    out = []
    title = pb.get("title")
    if title:
        out.append(f"<h3>Playbook: {esc(title)}</h3>")
    if pb.get("meaning"):
        out.append(f"<p>{esc(pb['meaning'])}</p>")
    immediate = dedupe(pb.get("immediate"))
    if immediate:
        out.append("<p><b>Now</b></p><ul>" + "".join(f"<li>{_text_with_cmds(x)}</li>" for x in immediate) + "</ul>")
    opts = pb.get("options") or []
    actions = dedupe(pb.get("actions"))
    if opts:  # the allocator settings are listed with their options below
        actions = [a for a in actions if not str(a).startswith("set PYTORCH_CUDA_ALLOC_CONF=")]
    if actions:
        out.append("<p><b>Fix (values computed from this incident)</b></p><ul>"
                   + "".join(f"<li>{_text_with_cmds(a)}</li>" for a in actions) + "</ul>")
    if opts:  # snapshot playbooks: allocator settings, each judged
        items = []
        for o in opts:
            verb = {True: "apply", False: "skip", None: "maybe"}.get(o.get("applies"), "maybe")
            cond = "".join(f"<li>needs: {esc(c)}</li>" for c in o.get("preconditions") or [])
            cond += "".join(f"<li>not if: {esc(c)}</li>" for c in o.get("contraindications") or [])
            items.append(f"<li><b>{esc(verb)}</b> <code class=\"cmd\">export PYTORCH_CUDA_ALLOC_CONF="
                         f"{esc(o.get('setting'))}</code> [{esc(o.get('status', ''))}]: {esc(o.get('why', ''))}"
                         f"{('<ul>' + cond + '</ul>') if cond else ''}</li>")
        out.append("<p><b>Allocator settings</b></p><ul>" + "".join(items) + "</ul>")
    durable = pb.get("durable") or []
    if durable:
        items = []
        for a in durable:
            if isinstance(a, dict):
                cond = "".join(f"<li>when: {esc(c)}</li>" for c in a.get("preconditions") or [])
                cond += "".join(f"<li>not when: {esc(c)}</li>" for c in a.get("contraindications") or [])
                sub = f"<ul>{cond}</ul>" if cond else ""
                items.append(f"<li>{_text_with_cmds(str(a.get('text', '')))}{sub}</li>")
            else:
                items.append(f"<li>{_text_with_cmds(str(a))}</li>")
        out.append("<details><summary>Durable fixes with their preconditions and contraindications</summary><ul>"
                   + "".join(items) + "</ul></details>")
    verify = dedupe(pb.get("verify"))
    if verify:
        out.append("<details><summary>How to verify it worked</summary><ul>"
                   + "".join(f"<li>{esc(v)}</li>" for v in verify) + "</ul></details>")
    refs = pb.get("references") or []
    if refs:
        out.append("<details><summary>References</summary><ul>" + "".join(f"<li>{esc(r)}</li>" for r in refs)
                   + "</ul></details>")
    fid = f.get("id")
    if fid:
        out.append(f'<p class="small">In a terminal: <code class="cmd">diagnose explain {esc(fid)}</code></p>')
    return "".join(out)
