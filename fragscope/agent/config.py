"""Agent configuration: defaults < TOML file < environment (``FRAGSCOPE_*``) < command-line flags.

Every setting has one dotted key (``vllm.urls``, ``store.retention``); its environment variable is
``FRAGSCOPE_`` + the key upper-cased with dots as underscores (``FRAGSCOPE_VLLM_URLS``), and the TOML
file uses the same key as ``[section] name``. The full list is docs/agent.md (a contract).
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..units import parse_duration as _parse_duration
from ..units import parse_size as _parse_size

# The agent's default port. Not 9400 (dcgm-exporter's default, often on the same node or pod),
# 9100 (node-exporter), 8000-8002 (vLLM, Triton), 80/3000 (TGI) or 30000 (SGLang): 9655 was free on
# the Prometheus project's list of exporter ports ("Default port allocations" on the Prometheus wiki)
# when chosen. Every default, help text and example reads this one constant (docs/agent.md#listen-address).
DEFAULT_PORT = 9655
DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"


class ConfigError(ValueError):
    """A bad setting; the message is one line naming the key, its source and the fix."""


def parse_duration(v: Any, what: str = "duration") -> float:
    """``90`` / ``"90s"`` / ``"2m"`` / ``"1h30m"`` / ``"7d"`` / ``"250ms"`` -> seconds (float, > 0):
    :func:`fragscope.units.parse_duration`, its error as a ConfigError naming ``what``."""
    try:
        return _parse_duration(v)
    except ValueError as e:
        raise ConfigError(f"{what}: {e}") from None


def _duration_or_off(v: Any, what: str = "duration") -> float:
    """A duration, or 0 / "off" for never."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and float(v) == 0.0:
        return 0.0
    if str(v).strip().lower() in ("0", "0s", "off", "never", "false"):
        return 0.0
    return parse_duration(v, what)


def parse_size(v: Any, what: str = "size") -> int:
    """``1073741824`` / ``"512MB"`` / ``"1GiB"`` -> bytes (int, > 0): :func:`fragscope.units.parse_size`."""
    try:
        return _parse_size(v)
    except ValueError:
        raise ConfigError(f"{what}: expected a positive size like 512MB or 1GiB, got {v!r}") from None


def parse_listen(v: str, what: str = "listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9655`` for IPv6, ``:9655`` for all interfaces) -> (host, port)."""
    s = str(v).strip()
    host, sep, port = s.rpartition(":")
    if not sep:
        raise ConfigError(f"{what}: expected HOST:PORT (e.g. {DEFAULT_LISTEN}), got {v!r}")
    host = host.strip("[]") or "0.0.0.0"
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"{what}: port must be a number in HOST:PORT, got {v!r}") from None
    if not 0 <= p <= 65535:
        raise ConfigError(f"{what}: port {p} out of range 0-65535")
    return host, p


def _url(v: Any, what: str) -> str:
    """An engine or exporter address as every command takes it (collectors/endpoint.py): ``http(s)://...``
    or ``host:port[/path]`` (made ``http://``); the page behind it is found when the collector runs."""
    from ..collectors.endpoint import EndpointError, looks_like_url, normalise

    s = str(v).strip()
    if not looks_like_url(s) or re.search(r"\s", s):
        raise ConfigError(f"{what}: expected an http(s):// URL or host:port, got {v!r}")
    try:
        return normalise(s)
    except EndpointError as e:
        raise ConfigError(f"{what}: {e}") from None


def _bool(v: Any, what: str) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what}: expected true or false, got {v!r}")


def _tristate(v: Any, what: str) -> str:
    s = str(v).strip().lower() if not isinstance(v, bool) else ("true" if v else "false")
    if s in ("auto",):
        return "auto"
    return "true" if _bool(s, what) else "false"


def _url_list(v: Any, what: str) -> list[str]:
    if isinstance(v, str):
        items = [x for x in re.split(r"[,\s]+", v) if x]
    elif isinstance(v, (list, tuple)):
        items = list(v)
    else:
        raise ConfigError(f"{what}: expected a list of URLs, got {v!r}")
    return [_url(x, what) for x in items]


def _word_list(v: Any, what: str) -> list[str]:
    items = re.split(r"[,\s]+", v.strip()) if isinstance(v, str) else list(v) if isinstance(v, (list, tuple)) else None
    if items is None:
        raise ConfigError(f"{what}: expected a list of words, got {v!r}")
    return [str(x) for x in items if str(x)]


def _pid_list(v: Any, what: str) -> list[int]:
    out = []
    for x in _word_list(v, what):
        if not x.isdigit() or int(x) <= 0:
            raise ConfigError(f"{what}: expected process ids (positive integers), got {x!r}")
        out.append(int(x))
    return out


def _opt_str(v: Any, what: str) -> str | None:
    s = str(v).strip() if v is not None else ""
    return s or None


def _opt_url(v: Any, what: str) -> str | None:
    s = _opt_str(v, what)
    return _url(s, what) if s else None


def _pos_int(v: Any, what: str) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: expected a whole number, got {v!r}") from None
    if n <= 0:
        raise ConfigError(f"{what}: must be positive, got {v!r}")
    return n


def _log_level(v: Any, what: str) -> str:
    s = str(v).strip().upper()
    if s not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"{what}: expected debug, info, warning or error, got {v!r}")
    return s.lower()


# key -> (attribute, parser, help). Order is the order of --print-config.
_KEYS: dict[str, tuple[str, Any, str]] = {
    "listen": ("listen", lambda v, w: "%s:%d" % parse_listen(v, w), "exporter + API address HOST:PORT"),
    "data_dir": ("data_dir", _opt_str, "directory of the SQLite history (created if missing)"),
    "interval": ("interval", parse_duration, "default sampling interval of every collector"),
    "log_level": ("log_level", _log_level, "debug | info | warning | error"),
    "vllm.urls": ("vllm_urls", _url_list, "engine addresses, http://host:8000 or the /metrics URL (one collector each)"),
    "vllm.interval": ("vllm_interval", parse_duration, "vLLM scrape interval (default: interval)"),
    "vllm.timeout": ("vllm_timeout", parse_duration, "vLLM scrape timeout"),
    "vllm.max_bytes": ("vllm_max_bytes", parse_size, "largest /metrics body accepted"),
    "dcgm.url": ("dcgm_url", _opt_url, "dcgm-exporter address, http://host:9400 or the /metrics URL"),
    "dcgm.interval": ("dcgm_interval", parse_duration, "dcgm scrape interval (default: interval)"),
    "dcgm.timeout": ("dcgm_timeout", parse_duration, "dcgm scrape timeout"),
    "nvml.enabled": ("nvml_enabled", _tristate, "auto | true | false (auto: on unless dcgm.url is set)"),
    "nvml.recorded": ("nvml_recorded", _opt_str, "recorded NVML backend file (demo and tests)"),
    "nvml.interval": ("nvml_interval", parse_duration, "NVML sampling interval (default: interval)"),
    "torch.probe_dir": ("probe_dir", _opt_str, "directory the in-engine probe publishes to"),
    "torch.interval": ("torch_interval", parse_duration, "probe read interval (default: interval)"),
    "process.enabled": ("process_enabled", _bool, "engine process CPU/RSS/threads and cgroup throttling"),
    "process.interval": ("process_interval", parse_duration, "process sampling interval (default: interval)"),
    "process.match": ("process_match", _word_list, "words in the engine processes' name or command line"),
    "process.pids": ("process_pids", _pid_list, "the engine's process ids (instead of matching names); the first "
                     "one's cgroup is the engine's container"),
    "logs.file": ("log_file", _opt_str, "engine log file to follow"),
    "logs.interval": ("logs_interval", parse_duration, "log read interval (default: interval)"),
    "store.enabled": ("store_enabled", _bool, "keep history in SQLite under data_dir"),
    "store.retention": ("retention", parse_duration, "drop history older than this"),
    "store.max_size": ("max_store_bytes", parse_size, "bound on the history's size on disk"),
    "store.flush_interval": ("flush_interval", parse_duration, "write batched samples this often"),
    "store.keep": ("store_keep", lambda v, w: _choice(v, w, ("signals", "all")),
                   "signals: only what detectors and the exporter use; all: every scraped series"),
    "detect.interval": ("detect_interval", parse_duration, "run the detectors this often"),
    "detect.watch_interval": ("detect_watch_interval", parse_duration,
                              "check the last 2 minutes' level evidence this often between runs (0: off)"),
    "detect.window": ("detect_window", parse_duration, "recent window the detectors judge"),
    "detect.step": ("detect_step", parse_duration, "resolution of the in-memory detection window"),
    "capture.enabled": ("capture_enabled", _bool, "capture deep evidence (snapshots, traces) on findings"),
    "capture.max_per_hour": ("capture_max_per_hour", _pos_int, "rate limit of captures"),
    "capture.profiler_dir": ("capture_profiler_dir", _opt_str,
                             "the engine's torch profiler directory (VLLM_TORCH_PROFILER_DIR) as the agent sees it"),
    "capture.profile_every": ("capture_profile_every", _duration_or_off,
                              "take a short profile this often for kernel-gap signals (0: only on findings)"),
    "capture.probe_uids": ("capture_probe_uids", lambda v, w: _uid_list(v, w),
                           "extra owners (uids) whose probe/trace files are read, besides the agent's user "
                           "and the directory's owner"),
    "collector.max_backoff": ("max_backoff", parse_duration, "longest wait between retries of a failing collector"),
    "api.max_points": ("api_max_points", _pos_int, "largest number of points one API response carries"),
    "limits.series_per_collector": ("max_series_per_collector", _pos_int,
                                    "series one collector may export; past it the excess is dropped (counted)"),
    "limits.label_value_bytes": ("max_label_value_bytes", _pos_int, "longest label value kept (longer: series dropped)"),
    "limits.ring_series": ("max_ring_series", _pos_int, "series held in the detection window (least recent evicted)"),
    "limits.ring_points": ("max_ring_points", _pos_int, "points held in the detection window, all series"),
}


def _uid_list(v: Any, what: str) -> list[int]:
    items = re.split(r"[,\s]+", v.strip()) if isinstance(v, str) else list(v) if isinstance(v, (list, tuple)) else [v]
    out = []
    for x in items:
        if x == "":
            continue
        try:
            u = int(x)
        except (TypeError, ValueError):
            raise ConfigError(f"{what}: expected user ids (integers), got {x!r}") from None
        if isinstance(x, bool) or not 0 <= u < 2**32:
            raise ConfigError(f"{what}: expected user ids (integers), got {x!r}")
        out.append(u)
    return out


def _choice(v: Any, what: str, choices: tuple[str, ...]) -> str:
    s = str(v).strip().lower()
    if s not in choices:
        raise ConfigError(f"{what}: expected one of {', '.join(choices)}, got {v!r}")
    return s


@dataclass
class AgentConfig:
    """The agent's effective settings (units: seconds and bytes)."""

    # 0.0.0.0: Prometheus scrapes the sidecar from another pod, like every exporter (dcgm-exporter and
    # node-exporter bind all interfaces too). Everything served is read-only; use 127.0.0.1:9655 to
    # keep it local (docs/agent.md).
    listen: str = DEFAULT_LISTEN
    data_dir: str | None = "/var/lib/fragscope"
    interval: float = 1.0
    log_level: str = "info"
    vllm_urls: list[str] = field(default_factory=list)
    vllm_interval: float | None = None
    vllm_timeout: float = 2.0
    # a vLLM /metrics is ~50 kB (V1, one model); 4 MiB leaves 80x room and bounds what one scrape costs
    vllm_max_bytes: int = 4 * 1024 * 1024
    dcgm_url: str | None = None
    dcgm_interval: float | None = None
    dcgm_timeout: float = 2.0
    nvml_enabled: str = "auto"
    nvml_recorded: str | None = None
    nvml_interval: float | None = None
    probe_dir: str | None = None
    torch_interval: float | None = None
    process_enabled: bool = True
    process_interval: float | None = None
    process_match: list[str] = field(default_factory=lambda: ["vllm"])
    process_pids: list[int] | None = None
    log_file: str | None = None
    logs_interval: float | None = None
    store_enabled: bool = True
    retention: float = 7 * 86400.0
    max_store_bytes: int = 1024**3
    flush_interval: float = 5.0
    store_keep: str = "signals"
    detect_interval: float = 30.0
    # Between full runs, a cheap look at the present (the last 2 minutes, level evidence only): a new
    # warning or critical there runs the detectors at once, so a storm is flagged within seconds.
    detect_watch_interval: float = 5.0
    detect_window: float = 3 * 3600.0
    detect_step: float = 5.0  # the present (last minute) needs >= 3 points: a storm shows within ~15 s
    capture_enabled: bool = False
    capture_max_per_hour: int = 4
    capture_profiler_dir: str | None = None
    capture_probe_uids: list[int] = field(default_factory=list)
    capture_profile_every: float = 0.0  # e.g. 600 (10 min): fragscope_kernel_gap_seconds every 10 min
    max_backoff: float = 60.0
    # 16 bytes a point in numpy while a response streams out; 3 h at 15 s of 250 series is 180k
    api_max_points: int = 200_000
    # the memory budget for what the engine exports (agent/budget.py, docs/agent.md#memory-budget)
    max_series_per_collector: int = 2048
    max_label_value_bytes: int = 2048
    max_ring_series: int = 4096
    max_ring_points: int = 2_000_000
    sources: dict[str, str] = field(default_factory=dict)  # key -> "default" | "file" | "env" | "flag"

    # -----------------------------------------------------------------------------------------
    def interval_of(self, collector: str) -> float:
        v = getattr(self, f"{collector}_interval", None)
        return float(v) if v else self.interval

    @property
    def listen_addr(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    def nvml_on(self) -> bool:
        if self.nvml_recorded:
            return self.nvml_enabled != "false"
        if self.nvml_enabled == "auto":
            return self.dcgm_url is None
        return self.nvml_enabled == "true"

    def set(self, key: str, value: Any, source: str) -> None:
        if key not in _KEYS:
            raise ConfigError(f"unknown setting {key!r} ({source}); known: {', '.join(_KEYS)}")
        attr, parser, _ = _KEYS[key]
        try:
            setattr(self, attr, parser(value, f"{key} ({source})"))
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{key} ({source}): {e}") from None
        self.sources[key] = source

    def get(self, key: str) -> Any:
        return getattr(self, _KEYS[key][0])

    def validate(self) -> None:
        if self.detect_step > self.detect_window:
            raise ConfigError("detect.step must not exceed detect.window")
        if self.store_enabled and not self.data_dir:
            raise ConfigError("store.enabled is true but data_dir is empty: give --data-dir DIR "
                              "or set store.enabled = false")

    def to_toml(self) -> str:
        """The effective config as TOML, each key annotated with where it came from."""
        top: list[str] = []
        sections: dict[str, list[str]] = {}
        for key, (attr, _, help_) in _KEYS.items():
            v = getattr(self, attr)
            src = self.sources.get(key, "default")
            sec, _, name = key.rpartition(".")
            if v is None:
                line = f"# {name} = (unset)  # {help_}"
            else:
                line = f"{name} = {_toml_value(v, key)}  # {src}: {help_}"
            (sections.setdefault(sec, []) if sec else top).append(line)
        out = ["# fragscope agent: effective configuration (precedence: flag > env > file > default)"]
        out += top
        for sec, lines in sections.items():
            out.append("")
            out.append(f"[{sec}]")
            out += lines
        return "\n".join(out) + "\n"


def _toml_value(v: Any, key: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if isinstance(v, float) and v.is_integer():
            return str(int(v))
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x, key) for x in v) + "]"
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


def keys() -> dict[str, str]:
    """Setting key -> help text (docs and --help)."""
    return {k: h for k, (_, _, h) in _KEYS.items()}


def env_name(key: str) -> str:
    return "FRAGSCOPE_" + key.upper().replace(".", "_")


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_config(path: str | None = None, env: Mapping[str, str] | None = None,
                flags: Mapping[str, Any] | None = None) -> AgentConfig:
    """Build the effective config. ``flags`` maps setting keys to values given on the command line
    (None values are ignored). Raises ConfigError with a one-line message."""
    cfg = AgentConfig()
    env = os.environ if env is None else env
    path = path or env.get("FRAGSCOPE_CONFIG") or None
    if path:
        # imported here: `diagnose FILE` reads this module for the agent's default port, not a config file
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - 3.10
            import tomli as tomllib
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except IsADirectoryError:
            raise ConfigError(f"{path}: is a directory, expected a TOML config file") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read config ({e.strerror or e})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not valid TOML ({str(e).splitlines()[0]})") from None
        for key, v in _flatten(data).items():
            cfg.set(key, v, f"file {path}")
    for key in _KEYS:
        name = env_name(key)
        if name in env and env[name] != "":
            cfg.set(key, env[name], f"env {name}")
    for key, v in (flags or {}).items():
        if v is None or v == () or v == []:
            continue
        cfg.set(key, v, "flag")
    cfg.validate()
    return cfg
