"""``fragscope mcp``: the Model Context Protocol server (docs/mcp.md). The SDK is imported only when it runs."""
from __future__ import annotations

import click

from .common import ByteSize, Duration, fail


@click.command("mcp")
@click.option("--allow-dir", "allow_dirs", metavar="DIR", multiple=True,
              help="A directory whose files the tools may read (repeatable). [default: none]")
@click.option("--allow-url", "allow_urls", metavar="URL|HOST|NET", multiple=True,
              help="A host (http://10.0.0.7:8000, host:port, host) or a network (10.0.0.0/8) the tools may reach "
                   "(repeatable). [default: none]")
@click.option("--listen", metavar="HOST:PORT", default=None,
              help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (no authentication: keep it "
                   "on 127.0.0.1).")
@click.option("--call-timeout", type=Duration(lo=1.0, hi=3600.0), default="3m", show_default=True,
              help="How long one tool call may take, e.g. 3m.")
@click.option("--max-output-bytes", type=ByteSize(lo=4096, hi=64 << 20), default="512KiB", show_default=True,
              help="Cap on one result's structured content (JSON bytes), e.g. 512KiB.")
@click.option("--max-file-bytes", type=ByteSize(hi=1 << 40), default="256MiB", show_default=True,
              help="Largest file a tool reads, e.g. 256MiB.")
def mcp_cmd(allow_dirs, allow_urls, listen, call_timeout, max_output_bytes, max_file_bytes) -> int:
    """Answer an AI assistant's questions (Model Context Protocol, stdio or --listen): read-only, files only
    under --allow-dir, hosts only in --allow-url."""
    try:
        from ..mcp.server import Limits, parse_listen, serve
    except ImportError as e:
        fail(f"fragscope mcp needs the MCP SDK: pip install 'fragscope[mcp]' ({e})")
    from ..mcp.policy import Policy, PolicyError

    try:
        policy = Policy.build(allow_dirs, allow_urls, max_file_bytes=max_file_bytes)
    except PolicyError as e:
        fail(str(e))
    if listen is not None:
        try:
            host, _ = parse_listen(listen)
        except ValueError as e:
            fail(str(e))
        if host not in ("127.0.0.1", "localhost", "::1"):
            click.echo(f"fragscope mcp: warning: --listen {listen} is reachable from other hosts and has no "
                       "authentication", err=True)
    limits = Limits(call_timeout_s=call_timeout, max_output_bytes=max_output_bytes,
                    max_live_seconds=min(120.0, max(1.0, call_timeout - 10.0)))
    serve(policy, limits, listen)
    return 0


def register(fragscope_group: click.Group, diagnose_group: click.Group) -> None:
    fragscope_group.add_command(mcp_cmd)
