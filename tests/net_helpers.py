"""Talking to servers the tests start on 127.0.0.1: a free port, a JSON GET that keeps the status."""
from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request


def free_port() -> int:
    """A port nothing listens on now (the OS picks it; a test binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0) -> tuple[int, object]:
    """(HTTP status, decoded JSON body), for error statuses too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
