"""Paste repair for /metrics text copied into bug reports: markdown quotes and fences, shell prompts,
HTML entities, lines a browser or terminal wrapped. Used by the line parser in scrape mode only.
"""
from __future__ import annotations

import re

from .exposition_syntax import NAME_START, valid_sample

# First characters of lines that need cleaning before parsing: indentation, markdown quotes and
# fences, shell prompts, non-breaking spaces, a byte-order mark, HTML tags around code blocks.
PASTE_START = frozenset(" \t>`~$\u00a0\ufeff<")
_FENCE = ("```", "~~~")
_HTML_TAG = re.compile(r"^</?(?:details|summary|pre|code|p|br|div|span|b|i)\b[^>]*>.*$", re.I)
_COMMAND = re.compile(r"(?:^|\s)(?:curl|wget|http|kubectl|docker|oc|grep)\s|^\S*[$#%]\s|^\$\s*$")
_ELLIPSIS = re.compile(r"^\s*(?:\.{2,}|\u2026|\[(?:\.{3}|\u2026|snip|truncated)[^\]]*\])\s*$", re.I)
NUM_TAIL = re.compile(r"^\s*[0-9.eE+\-]+\s*$")
_ENTITY = re.compile(r"&(?:quot|gt|lt|amp|apos|#\d{1,7}|#[xX][0-9a-fA-F]{1,6});")


def depaste(line: str) -> str | None:
    """A line with paste debris around it cleaned, or None when the whole line is debris."""
    s = line.replace("\u00a0", " ").lstrip(" \t\ufeff")
    while s[:1] == ">":  # markdown quote, possibly nested
        s = s[1:].lstrip(" \t")
    if not s.strip():
        return "\n"
    if s.startswith(_FENCE) or _HTML_TAG.match(s.strip()):
        return None
    if s[0] == "`":  # inline code around a paste: "`# HELP ..."
        s = s.lstrip("`")
    if s[0] == "$" and (len(s) < 2 or s[1] in " \t\n"):
        return None  # a shell prompt line: "$ curl ... /metrics"
    return s


def is_debris(line: str) -> bool:
    """A line of a paste that is not data and not worth an error: the command that made the scrape,
    an ellipsis where the reporter cut it, markdown or HTML around the code block."""
    s = line.strip()
    if not s:
        return True
    return bool(_COMMAND.search(s) or _ELLIPSIS.match(s) or _HTML_TAG.match(s) or s.startswith(_FENCE))


def unescape_html(line: str) -> str:
    """Complete entities only (``&quot;``, not ``&quot`` which html.unescape also decodes): a wrap
    may cut an entity in two, and the join must see it whole."""
    if _ENTITY.search(line) is None:
        return line
    import html  # here: html.entities' table costs ~10 ms of every start, and few inputs hold an entity

    return _ENTITY.sub(lambda m: html.unescape(m.group(0)), line)


def could_continue(line: str) -> bool:
    """An incomplete sample (a name or label set cut by a wrap): the next line may finish it."""
    s = line.strip()
    return bool(s) and len(s) < 4096 and bool(NAME_START.match(s))


def join_wrapped(first: str, second: str) -> str | None:
    """``first`` (incomplete) joined with ``second`` when that makes one valid sample line."""
    a = first.rstrip("\r\n")
    b = second.lstrip(" \t")
    for sep in ("", " "):
        cand = a + sep + b
        if "&" in cand:
            cand = unescape_html(cand)  # an entity the wrap cut in two: "&quot" + ";"
        if valid_sample(cand):
            return cand
    return None


# A Prometheus query result copied from its web UI's table into markdown: "series{labels} | value" rows under a
# "-- | --" separator, optionally between pipes ("| series | value |"). Only a pipe after the series' closing brace
# (or after a bare name) is a column: a label value may hold "|" itself.
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*\|\s*:?-{2,}:?\s*\|?\s*$")
_TABLE_TAIL = re.compile(r"\s*\|\s*([^\s|]+)\s*\|?\s*$")
_BARE_ROW = re.compile(r"^\s*\|?\s*([A-Za-z_:][\w:]*)\s*\|\s*([^\s|]+)\s*\|?\s*$")


def table_row(line: str) -> str | None:
    """``line`` as a sample line when it is a row of a markdown table of query results (``series | value``),
    None for the table's separator row, else ``line`` itself (the same object)."""
    if _TABLE_SEP.match(line):
        return None
    close = line.rfind("}")
    if close >= 0:
        m = _TABLE_TAIL.match(line, close + 1)
        if m is None:
            return line
        head = line[:close + 1].lstrip(" \t")
        if head.startswith("|"):
            head = head[1:].lstrip(" \t")
        return f"{head} {m.group(1)}\n"
    m = _BARE_ROW.match(line)
    return f"{m.group(1)} {m.group(2)}\n" if m else line
