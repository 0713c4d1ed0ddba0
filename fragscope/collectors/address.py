"""What a command-line argument naming a server looks like: ``http(s)://...`` or ``host:port[/path]``.

Standard library only (``re``): ``diagnose FILE`` asks this of every FILE that does not exist, before
anything that talks HTTP is imported.
"""
from __future__ import annotations

import re

_HOSTPORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})(/.*)?$")


def looks_like_url(arg: str) -> bool:
    """True for an http(s):// URL or a bare ``host:port[/path]`` (the caller checks first that
    ``arg`` is not an existing file)."""
    return bool(re.match(r"^https?://", arg, re.I) or _HOSTPORT.match(arg))
