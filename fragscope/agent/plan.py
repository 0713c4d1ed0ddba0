"""Which collectors the agent runs: the config turned into a list of (name, kind, constructor, interval,
timeout). Constructors run later, in the agent, so one that fails to import or start stays down
alone (docs/agent.md#collectors).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .config import AgentConfig

# Kinds whose source is the serving engine: when one of them is down the agent cannot judge the
# engine, so /readyz fails (docs/agent.md#health). dcgm, NVML, the process, probe and log
# collectors do not make the agent unready on their own (their state is in /api/v1/status).
ENGINE_KINDS = frozenset({"vllm"})


@dataclass
class Planned:
    name: str
    kind: str
    make: Callable[[], Any]
    interval: float
    timeout: float


def plan_collectors(cfg: AgentConfig) -> list[Planned]:
    """The collectors the config asks for; constructed later, each import failure isolated."""
    plan: list[Planned] = []
    vt = cfg.vllm_timeout
    for i, url in enumerate(cfg.vllm_urls):
        name = "vllm" if len(cfg.vllm_urls) == 1 else f"vllm_{i}"

        def mk(url=url):
            from ..collectors.vllm import VllmCollector

            return VllmCollector(url, timeout_s=vt, max_bytes=cfg.vllm_max_bytes)
        plan.append(Planned(name, "vllm", mk, cfg.interval_of("vllm"), vt + 1.0))
    if cfg.dcgm_url:
        def mk_dcgm():
            from ..collectors.dcgm import DcgmCollector

            return DcgmCollector(cfg.dcgm_url, timeout_s=cfg.dcgm_timeout, max_bytes=cfg.vllm_max_bytes)
        plan.append(Planned("dcgm", "dcgm", mk_dcgm, cfg.interval_of("dcgm"), cfg.dcgm_timeout + 1.0))
    if cfg.nvml_on():
        def mk_nvml():
            from ..collectors import nvml

            if cfg.nvml_recorded:
                return nvml.NvmlCollector(backend=nvml.RecordedBackend(cfg.nvml_recorded))
            return nvml.NvmlCollector()
        plan.append(Planned("nvml", "nvml", mk_nvml, cfg.interval_of("nvml"), 5.0))
    if cfg.probe_dir:
        def mk_torch():
            from ..collectors.torch import TorchProbeCollector

            return TorchProbeCollector(cfg.probe_dir, extra_uids=tuple(cfg.capture_probe_uids))
        plan.append(Planned("torch", "torch", mk_torch, cfg.interval_of("torch"), 5.0))
    if cfg.process_enabled:
        def mk_proc():
            from ..collectors.process import ProcessCollector

            # the engine is the given pids, else the process serving the engine URLs (or running the probe),
            # a name match only as a labelled guess
            return ProcessCollector(match=cfg.process_match, pids=cfg.process_pids, endpoints=cfg.vllm_urls,
                                    probe_dir=cfg.probe_dir)
        plan.append(Planned("process", "process", mk_proc, cfg.interval_of("process"), 5.0))
    if cfg.log_file:
        def mk_logs():
            from ..collectors.logs import LogCollector

            return LogCollector(cfg.log_file)
        plan.append(Planned("logs", "logs", mk_logs, cfg.interval_of("logs"), 5.0))
    return plan

