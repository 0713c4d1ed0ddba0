"""The agent's default port: one constant (9655, not dcgm-exporter's 9400), used by the config default,
the CLI help, the error hints, docs/agent.md and the README."""
from __future__ import annotations

import os
import re

from click.testing import CliRunner

from fragscope.agent.config import DEFAULT_LISTEN, DEFAULT_PORT, AgentConfig, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ports of what runs beside the agent: dcgm-exporter, node-exporter, vLLM / Triton, TGI, SGLang, Prometheus
TAKEN = {9400, 9100, 8000, 8001, 8002, 80, 3000, 30000, 9090, 9093}


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
        return fh.read()


def test_default_port_collides_with_no_neighbour():
    assert DEFAULT_PORT == 9655 and DEFAULT_PORT not in TAKEN
    assert AgentConfig().listen == DEFAULT_LISTEN == "0.0.0.0:9655"
    assert load_config(None, {}, {}).listen_addr == ("0.0.0.0", 9655)


def test_help_and_print_config_show_the_constant():
    from fragscope.cli import fragscope_group

    r = CliRunner().invoke(fragscope_group, ["agent", "--help"])
    text = " ".join(r.output.split())
    assert "[default: 0.0.0.0:9655]" in text
    assert all("dcgm" in text[max(0, m.start() - 80): m.start()] for m in re.finditer("9400", text))
    r = CliRunner().invoke(fragscope_group, ["agent", "--print-config", "--no-store"])
    assert 'listen = "0.0.0.0:9655"  # default' in r.output


def test_docs_readme_and_example_config_use_it():
    agent_md = _read("docs/agent.md")
    assert f"| `listen` | `FRAGSCOPE_LISTEN` | `{DEFAULT_LISTEN}` |" in agent_md
    assert "Default-port-allocations" in agent_md  # the why, with its source
    assert f'listen = "{DEFAULT_LISTEN}"' in _read("deploy/agent.toml")
    for rel in ("README.md", "docs/agent.md", "docs/cli.md"):
        text = _read(rel)
        for m in re.finditer(r"https?://[\w.-]+:(\d+)", text):
            line = text[text.rfind("\n", 0, m.start()) + 1: text.find("\n", m.end())]
            if "--agent" in line:
                assert m.group(1) == str(DEFAULT_PORT), f"{rel}: {line}"
        # 9400 only where dcgm-exporter is meant (named in the same sentence)
        for m in re.finditer(r"9400", text):
            near = text[max(0, m.start() - 120): m.end() + 40]
            assert "dcgm" in near.lower(), f"{rel}: {near}"


def test_unreachable_agent_hint_names_the_default_port(capsys):
    """The hint of a failed `diagnose --agent` (it raised NameError once: the constant was not imported)."""
    import socket

    from fragscope.cli import cli_exit_code, diagnose_group

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url in (f"http://127.0.0.1:{port}", f"127.0.0.1:{port}", f"http://127.0.0.1:{port}/metrics"):
        rc = cli_exit_code(diagnose_group, "diagnose", ["--agent", url])
        err = capsys.readouterr().err
        assert rc == 2 and f"default port {DEFAULT_PORT}" in err and f"127.0.0.1:{port}/api/v1/window" in err, err
    rc = cli_exit_code(diagnose_group, "diagnose", ["--agent", "ftp://pod"])
    err = capsys.readouterr().err
    assert rc == 2 and f"e.g. http://pod:{DEFAULT_PORT}" in err
