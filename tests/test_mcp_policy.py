"""What ``fragscope mcp`` may read and reach (fragscope/mcp/policy.py), without the MCP SDK: paths walked without
following a link out of the allowed directories, URLs checked by host and resolved address, and the same
checks enforced where the readers open files (the safe opener) and where sockets connect (an audit hook)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from fragscope.collectors.safefile import open_regular_fd
from fragscope.mcp import policy as pol
from fragscope.mcp.policy import Policy, PolicyError, UrlRule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def tree(tmp_path):
    """allowed/ with a file, a subdirectory, links inside and out; outside/ with a secret."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    (allowed / "a.txt").write_text("inside\n")
    (allowed / "sub" / "b.txt").write_text("inside too\n")
    (outside / "secret.txt").write_text("secret\n")
    os.symlink(outside / "secret.txt", allowed / "abs-escape.txt")
    os.symlink("../outside/secret.txt", allowed / "rel-escape.txt")
    os.symlink(outside, allowed / "dir-escape")
    os.symlink("sub/b.txt", allowed / "inner-link.txt")
    os.symlink(allowed / "sub", allowed / "abs-inner-dir")
    return allowed, outside


def test_no_directory_allowed_by_default_says_how(tree):
    allowed, _ = tree
    with pytest.raises(PolicyError, match=r"--allow-dir DIR"):
        Policy.build([]).resolve_file(str(allowed / "a.txt"))


def test_files_inside_are_read_relative_or_absolute(tree):
    allowed, _ = tree
    p = Policy.build([str(allowed)])
    real = os.path.realpath(allowed)
    assert p.resolve_file("a.txt")[0] == os.path.join(real, "a.txt")
    assert p.resolve_file(str(allowed / "sub" / "b.txt"))[0] == os.path.join(real, "sub", "b.txt")
    assert p.resolve_file("sub/../a.txt")[0] == os.path.join(real, "a.txt")
    # links that stay inside are followed, and the real path is what gets read
    assert p.resolve_file("inner-link.txt")[0] == os.path.join(real, "sub", "b.txt")
    assert p.resolve_file("abs-inner-dir/b.txt")[0] == os.path.join(real, "sub", "b.txt")


@pytest.mark.parametrize("path,why", [
    ("abs-escape.txt", "symbolic link leads out"),
    ("rel-escape.txt", "leads out"),
    ("dir-escape/secret.txt", "symbolic link leads out"),
    ("../outside/secret.txt", "outside the allowed directories"),
    ("sub/../../outside/secret.txt", "leads out"),
])
def test_escapes_are_refused(tree, path, why):
    allowed, _ = tree
    with pytest.raises(PolicyError, match=why):
        Policy.build([str(allowed)]).resolve_file(path)


def test_an_allowed_directory_given_through_a_link_answers_to_both_spellings(tree, tmp_path):
    allowed, _ = tree
    os.symlink(allowed, tmp_path / "incidents")
    p = Policy.build([str(tmp_path / "incidents")])
    real = os.path.join(os.path.realpath(allowed), "a.txt")
    assert p.resolve_file(str(tmp_path / "incidents" / "a.txt"))[0] == real
    assert p.resolve_file(str(allowed / "a.txt"))[0] == real
    with pytest.raises(PolicyError, match="symbolic link leads out"):
        p.resolve_file(str(tmp_path / "incidents" / "abs-escape.txt"))


def test_absolute_path_outside_and_special_files_refused(tree):
    allowed, outside = tree
    p = Policy.build([str(allowed)])
    with pytest.raises(PolicyError, match="outside the allowed directories"):
        p.resolve_file(str(outside / "secret.txt"))
    with pytest.raises(PolicyError, match="outside the allowed directories"):
        p.resolve_file("/etc/passwd")
    os.mkfifo(allowed / "fifo")
    with pytest.raises(PolicyError, match="FIFO"):
        p.resolve_file("fifo")  # O_NONBLOCK: the open does not wait for a writer
    with pytest.raises(PolicyError, match="directory"):
        p.resolve_file("sub")
    with pytest.raises(PolicyError, match="no such file"):
        p.resolve_file("missing.txt")


def test_oversized_file_refused(tree):
    allowed, _ = tree
    (allowed / "big.txt").write_bytes(b"x" * 101)
    p = Policy.build([str(allowed)], max_file_bytes=100)
    with pytest.raises(PolicyError, match=r"101 bytes, over the server's 100 byte cap"):
        p.resolve_file("big.txt")
    assert p.resolve_file("a.txt")[1].st_size == 7


def test_installed_policy_confines_the_safe_opener(tree):
    """While installed, every reader's open goes through the walk: a link out is refused at the open too."""
    allowed, outside = tree
    p = Policy.build([str(allowed)])
    pol.install(p)
    try:
        fd, st = open_regular_fd(str(allowed / "a.txt"))
        os.close(fd)
        assert st.st_size == 7
        for bad in (allowed / "abs-escape.txt", outside / "secret.txt"):
            with pytest.raises(PermissionError, match="refused by fragscope mcp"):
                open_regular_fd(str(bad))
    finally:
        pol.uninstall()
    fd, _ = open_regular_fd(str(outside / "secret.txt"))  # lifted: the CLI reads anything the user names
    os.close(fd)


# --- network -----------------------------------------------------------------------------------------
def test_rule_parsing():
    assert UrlRule.parse("http://127.0.0.1:8000").port == 8000
    assert UrlRule.parse("vllm.svc:8000").host == "vllm.svc"
    assert str(UrlRule.parse("10.0.0.0/8").network) == "10.0.0.0/8"
    with pytest.raises(PolicyError):
        UrlRule.parse("ftp://x")


def test_no_host_allowed_by_default_says_how():
    with pytest.raises(PolicyError, match=r"--allow-url"):
        Policy.build().check_url("http://127.0.0.1:8000")


def test_allowed_host_and_port_only():
    p = Policy.build(allow_urls=["http://127.0.0.1:8000"])
    assert p.check_url("127.0.0.1:8000/metrics") == "http://127.0.0.1:8000/metrics"
    with pytest.raises(PolicyError, match="not an allowed address|not allowed"):
        p.check_url("http://127.0.0.1:9000")
    with pytest.raises(PolicyError, match="10.1.2.3:8000, not an allowed address"):
        p.check_url("http://10.1.2.3:8000")
    assert p.address_allowed("127.0.0.1", 8000) and not p.address_allowed("127.0.0.1", 8001)
    assert not p.address_allowed("127.0.0.2", 8000)


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/", "169.254.169.254:80",
                                 "http://[fe80::1]:80/", "http://[fd00:ec2::254]/", "http://[::ffff:169.254.169.254]/"])
def test_metadata_addresses_refused_even_under_a_wide_rule(url):
    p = Policy.build(allow_urls=["0.0.0.0/0", "::/0"] if "ffff" not in url else ["::/0"])
    with pytest.raises(PolicyError, match="link-local|not an allowed"):
        p.check_url(url)
    assert not p.address_allowed("169.254.169.254", 80)


def test_metadata_address_allowed_only_when_named():
    p = Policy.build(allow_urls=["169.254.169.254/32"])
    assert p.check_url("http://169.254.169.254/") == "http://169.254.169.254/"


def test_a_host_name_is_checked_by_what_it_resolves_to():
    # localhost resolves to loopback: allowed by its name's rule, and by a network rule covering the address
    assert Policy.build(allow_urls=["localhost:8000"]).check_url("http://localhost:8000")
    assert Policy.build(allow_urls=["127.0.0.0/8"]).check_url("http://localhost:8000")
    with pytest.raises(PolicyError, match="not an allowed address|not allowed"):
        Policy.build(allow_urls=["10.0.0.0/8"]).check_url("http://localhost:8000")


def test_installed_policy_refuses_connections_to_other_addresses():
    """The audit hook checks the address every socket.connect uses (redirects, rebinding, any library)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    pol.install(Policy.build(allow_urls=[f"127.0.0.1:{port}"]))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        for addr in (("127.0.0.2", port), ("127.0.0.1", port + 1 if port < 65535 else port - 1),
                     ("169.254.169.254", 80)):
            with pytest.raises(PermissionError, match="not an allowed address"):
                socket.create_connection(addr, timeout=1)
        with socket.socket(socket.AF_UNIX) as s, pytest.raises(PermissionError, match="local sockets"):
            s.connect("/run/anything.sock")
    finally:
        pol.uninstall()
        srv.close()


def test_cli_and_agent_do_not_import_the_sdk():
    """The SDK is an optional extra: importing the CLI, the agent and running `fragscope --help` loads none of it."""
    code = ("import sys, contextlib, io\n"
            "import fragscope.cli, fragscope.agent.daemon, fragscope.mcp.policy, fragscope.mcp.tools\n"
            "from fragscope.cli import cli_exit_code, fragscope_group\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    cli_exit_code(fragscope_group, 'fragscope', ['--help'])\n"
            "    cli_exit_code(fragscope_group, 'fragscope', ['mcp', '--help'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types', 'uvicorn', 'starlette')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
