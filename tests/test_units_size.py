"""units.parse_size: the one size parser (agent configuration and CLI flags), both conventions."""
from __future__ import annotations

import pytest

from fragscope.agent.config import ConfigError, parse_size as config_size
from fragscope.cli.snapshot_cmd import parse_size as cli_size
from fragscope.units import parse_size


def test_binary_and_decimal_units():
    assert parse_size("1GiB") == 1073741824 and parse_size("512MB") == 512_000_000 and parse_size("2k") == 2000
    assert parse_size("2Ki") == 2048 and parse_size(" 1.5 TiB ") == int(1.5 * 1024 ** 4) and parse_size(7) == 7
    # the CLI reads GB as GiB (GPU memory is quoted that way): 80GB = 80 x 2**30
    assert parse_size("80GB", decimal_si=False) == 85899345920 == cli_size("80GB") == cli_size("80GiB")
    assert config_size("512MB") == 512_000_000 and config_size("1GiB") == 1073741824


@pytest.mark.parametrize("bad", ["", "x", "-1", "1e3", "9" * 400, "12 parsecs", True, float("nan"), float("inf"), 2.0 ** 63])
def test_garbage_is_refused(bad):
    with pytest.raises(ValueError):
        parse_size(bad)
    with pytest.raises(ConfigError):
        config_size(bad)


def test_zero_only_where_allowed():
    assert cli_size("0") == 0
    with pytest.raises(ValueError):
        parse_size("0")
