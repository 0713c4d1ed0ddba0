#!/usr/bin/env python3
"""Container HEALTHCHECK of the fragscope image: GET /healthz on the port the agent actually listens on.

The port comes from the agent's own configuration, resolved the way the agent resolves it: its
command-line flags (read from /proc/1/cmdline: the agent is the container's PID 1), then
FRAGSCOPE_LISTEN, then the config file (--config or FRAGSCOPE_CONFIG), then the default. So moving
the port with `--listen`, FRAGSCOPE_LISTEN or the config file never marks the container unhealthy.
Exit 0: healthy; 1: not (one line on stderr says why).
"""
from __future__ import annotations

import sys
import urllib.request


def agent_flags(cmdline: list[str]) -> dict[str, str]:
    """--listen and --config of a `fragscope agent ...` command line (both spellings: --k v, --k=v)."""
    out: dict[str, str] = {}
    for i, a in enumerate(cmdline):
        for flag, key in (("--listen", "listen"), ("--config", "config")):
            if a == flag and i + 1 < len(cmdline):
                out[key] = cmdline[i + 1]
            elif a.startswith(flag + "="):
                out[key] = a[len(flag) + 1:]
    return out


def probe_url(cmdline: list[str], env: dict[str, str]) -> str:
    from fragscope.agent.config import load_config, parse_listen

    flags = agent_flags(cmdline)
    cfg = load_config(flags.get("config"), env=env, flags={"listen": flags.get("listen")})
    host, port = parse_listen(cfg.listen)
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/healthz"


def main() -> int:
    import os

    try:
        with open("/proc/1/cmdline", "rb") as fh:
            cmdline = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        cmdline = []
    try:
        url = probe_url(cmdline, dict(os.environ))
    except Exception as e:  # a bad config is unhealthy, with the reason
        print(f"fragscope-healthcheck: {e}", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return 0 if r.status == 200 else 1
    except Exception as e:
        print(f"fragscope-healthcheck: {url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
