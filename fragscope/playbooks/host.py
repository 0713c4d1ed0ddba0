"""Diagnoses beyond the GPU's memory, judged on a metrics window: a CPU-starved engine, a stalled engine,
a straggling rank, a faulty GPU, a host out of memory. Their playbooks and computed actions, registered
with the detector that finds them (each detector judges its present state itself, so they run on windows
of any length)."""
from __future__ import annotations

import math

from ..detectors import cpu_starved, gpu_fault, host_memory, stalled, straggler
from ..model import Action, Playbook
from ..units import finite_or_none as _f, fmt_bytes
from .registry import Diagnosis


# --- engine-cpu-starved --------------------------------------------------------------------------
def _cpu_actions(ctx: dict, config: dict) -> list[str]:
    acts = []
    share, quota = _f(ctx.get("throttled_ratio")), _f(ctx.get("quota_cores"))
    lost = _f(ctx.get("throttled_seconds_per_second"))
    if share is not None and share > 0 and quota is not None:
        # each throttled period ran the quota out: at least the quota plus what the throttling took
        need = quota + (lost or 0.0)
        whole = max(1, math.ceil(need * 1.25))
        acts.append(f"Raise the engine container's CPU limit from {quota:.2f} to at least {whole} cores "
                    f"({share * 100:.0f} % of periods throttled, {lost or 0:.2f} s of CPU lost per second), or "
                    "remove the limit and keep the request.")
    elif share is not None and share > 0:
        acts.append(f"Raise or remove the engine container's CPU limit ({share * 100:.0f} % of periods throttled).")
    rq = _f(ctx.get("runqueue_ratio"))
    if (share is None or share == 0) and rq is not None:
        acts.append(f"The engine's threads wait for a CPU {rq * 100:.0f} % of their runnable time without a quota: "
                    "give the pod dedicated cores (requests = limits, whole cores, static CPU manager) or move "
                    "CPU-heavy neighbours off the node.")
    return acts


CPU_STARVED = Diagnosis.from_module(
    cpu_starved,
    Playbook(
        cpu_starved.ID, "Engine starved of CPU",
        "The engine's container runs out of its CPU quota (or waits for a CPU): its scheduler, tokenizer and "
        "kernel-launch loop stall every step, so requests queue, inter-token latency and TTFT rise and the "
        "GPU idles between kernels, though nothing on the GPU is wrong.",
        ["Raise or remove the container's CPU limit (kubectl edit / the chart's resources.limits.cpu) and "
         "roll the pod; the throttled share should fall to ~0 at once.",
         "If the limit cannot change now: route traffic away from this replica until it can."],
        [Action("Give the engine whole cores: resources.requests.cpu = resources.limits.cpu as an integer, so "
                "the kubelet's static CPU manager pins exclusive cores (Guaranteed QoS).",
                ["the node's kubelet runs --cpu-manager-policy=static",
                 "the node has that many whole cores to spare"],
                ["a best-effort or burstable pod shared with other workloads: pinning takes cores from them"]),
         Action("Remove the CPU limit and keep a CPU request sized to the measured usage (CFS quota throttles "
                "bursts even when the average is under the limit).",
                ["the namespace has no LimitRange forcing a limit", "the node is not oversubscribed"],
                ["multi-tenant nodes where a limit is a contract"]),
         Action("Fewer CPU-hungry threads in the engine: set OMP_NUM_THREADS / torch threads to the cores the "
                "container has (PyTorch sizes its pools from the host's CPU count, not the quota), and run "
                "fewer API-server processes (vLLM --api-server-count, SGLang --tokenizer-worker-num) than cores.",
                ["the threads counted by fragscope_process_threads far exceed the quota"],
                ["tokenization-bound traffic (long prompts, high request rates) needs its tokenizer workers: "
                 "give it cores instead"])],
        ["fragscope_container_cpu_throttled_periods_total rises by < 5 % of fragscope_container_cpu_periods_total",
         "inter-token latency and TTFT back to their baseline; requests waiting back to ~0",
         "GPU utilization back up at the same traffic"],
        ["Linux kernel docs: scheduler/sched-bwc.rst (CFS bandwidth control)",
         "Kubernetes docs: Control CPU Management Policies on the Node (static policy)",
         "kubernetes-mixin CPUThrottlingHigh alert (> 25 % of periods throttled)"]), actions=_cpu_actions, runs_on_short_windows=True)


# --- engine-stalled ------------------------------------------------------------------------------
def _stall_actions(ctx: dict, config: dict) -> list[str]:
    kind = ctx.get("kind")
    s = _f(ctx.get("stalled_seconds")) or 0
    acts = [f"Capture the stacks before restarting (the engine has made no progress for {s:.0f} s): "
            "py-spy dump --pid <engine core pid> (and each worker's), or send SIGUSR1 where faulthandler is "
            "registered."]
    if kind == "collective":
        acts.append("The GPUs spin with no progress: an NCCL collective waits for a rank that never joins. Restart "
                    "with NCCL_DEBUG=INFO and TORCH_NCCL_ASYNC_ERROR_HANDLING=1 / TORCH_NCCL_TRACE_BUFFER_SIZE set "
                    "so the next hang names the rank.")
    elif kind == "host":
        acts.append("The GPUs idle: the host side is stuck (a blocked or stopped process, a deadlocked thread). "
                    "Check the processes' state (ps -o stat: T stopped, D blocked on I/O) before restarting.")
    return acts


STALLED = Diagnosis.from_module(
    stalled,
    Playbook(
        stalled.ID, "Engine stalled: requests in flight, no progress",
        "Requests are running or waiting, yet the engine produces no token and finishes no request while its "
        "API server still answers: the engine loop is blocked (an NCCL collective that never completes, or a "
        "host-side hang). Readiness probes pass; every request in flight times out.",
        ["Capture stacks first (py-spy dump --pid PID for the engine core and each worker), then restart the "
         "engine (delete the pod): a hung collective does not recover by itself.",
         "Take the replica out of the load balancer: it accepts requests it will not serve."],
        [Action("Make the next hang diagnosable and bounded: NCCL_DEBUG=INFO (WARN in steady state), "
                "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a collective timeout, so a lost rank fails the process "
                "instead of hanging it.",
                ["a multi-GPU (tensor- or pipeline-parallel) engine"],
                ["NCCL_DEBUG=INFO logs every communicator: keep it off in steady state on busy nodes"]),
         Action("Add a liveness check on progress, not on the HTTP port: fail it when requests run and "
                "generation_tokens_total has not moved for a minute (this alert, or a probe script).",
                ["the engine exports its counters"],
                ["very long single prefills (hundreds of thousands of tokens) on slow GPUs can exceed a short "
                 "threshold: size it above the longest prefill"])],
        ["generation_tokens_total rises again and requests finish after the restart",
         "no new engine-stalled finding over the next hour"],
        ["PyTorch docs: torch.distributed environment variables (TORCH_NCCL_ASYNC_ERROR_HANDLING, "
         "TORCH_NCCL_TRACE_BUFFER_SIZE)", "NCCL docs: environment variables (NCCL_DEBUG)",
         "py-spy: py-spy dump --pid"]),
    actions=_stall_actions, runs_on_short_windows=True)


# --- rank-straggler ------------------------------------------------------------------------------
def _straggler_actions(ctx: dict, config: dict) -> list[str]:
    g = ctx.get("rank_gpu")
    why = ctx.get("why") or []
    gap = _f(ctx.get("clock_gap_ratio")) or 0
    acts = [f"GPU {g} sets the pace of every step ({gap * 100:.0f} % slower clock): check it first "
            f"(nvidia-smi -q -i {g} -d PERFORMANCE,CLOCK,TEMPERATURE,POWER)."]
    if any("PCIe" in w for w in why):
        acts.append(f"GPU {g}'s PCIe link is below its maximum: drain the node and reseat the GPU or its riser.")
    if any("°C" in w or "thermal" in w for w in why):
        acts.append(f"GPU {g} runs hotter than its peers: check its fans / airflow and the slot's cooling.")
    return acts


STRAGGLER = Diagnosis.from_module(
    straggler,
    Playbook(
        straggler.ID, "One rank slower than its peers",
        "In a multi-GPU engine one busy GPU runs slower than the others; every collective waits for it, so "
        "the whole engine runs at that GPU's speed while the other ranks idle inside NCCL.",
        ["Find why that GPU is slow (its clock reasons, temperature, PCIe link, power limit) before touching "
         "the engine's settings.",
         "If a spare node exists: move the engine off the node with the slow GPU."],
        [Action("Fix the slow GPU's cause: cooling for a thermal slowdown, reseating for a degraded PCIe link, "
                "resetting application clocks / power limits to the peers' values (nvidia-smi -rac, -pl).",
                ["the cause is named in the finding"],
                ["a power limit set on purpose (a power-capped rack): cap every GPU alike instead"]),
         Action("Replace or service the GPU if it stays slower with the same clocks, temperature and link as its "
                "peers.", ["the gap persists across reboots"], ["a single observation: confirm over hours first"])],
        ["the GPUs' SM clocks within a few % of each other under load", "throughput up at the same traffic"],
        ["HTA (Holistic Trace Analysis): comm/comp overlap and straggler analysis across ranks",
         "NVIDIA nvidia-smi: clocks event reasons"]), actions=_straggler_actions, runs_on_short_windows=True)


# --- gpu-hardware-fault --------------------------------------------------------------------------
HW_FAULT = Diagnosis.from_module(
    gpu_fault,
    Playbook(
        gpu_fault.ID, "GPU hardware fault",
        "The GPU reports a hardware fault (an Xid of a hardware class, uncorrectable ECC errors, a pending or "
        "failed row remap, retired pages, a degraded or erroring PCIe / NVLink link). No engine setting fixes "
        "it: the GPU needs a reset, the node a drain, or the board service.",
        ["Drain the node (kubectl cordon + drain) so no new work lands on the faulty GPU.",
         "Follow the action named in the finding (NVIDIA's Xid catalogue): reset the GPU (nvidia-smi -r, with no "
         "process on it) or reboot the node; RMA on a failed row remap or a repeating fault."],
        [Action("Reset the GPU to apply a pending row remap or page retirement, then run DCGM diagnostics "
                "(dcgmi diag -r 2) before returning the node to service.",
                ["no process uses the GPU (drained)"],
                ["a failed remap or repeated uncorrectable errors: the board needs service, not a reset"]),
         Action("Reseat the GPU (or its riser / cable) when its PCIe link trains below its maximum under load or "
                "replays keep climbing; service it if the link degrades again.",
                ["the node can be taken down"],
                ["a link that trains down only at idle: power management, not a fault"])],
        ["dcgmi diag -r 2 passes; Xid field back to 0 after the exporter restarts; ECC volatile counts 0 after "
         "the reset", "the PCIe link at its maximum generation and width under load; replays flat"],
        ["NVIDIA Xid catalogue: docs.nvidia.com/deploy/xid-errors (Resolution Bucket)",
         "NVIDIA A100+ GPU memory error management: docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt",
         "DCGM health watches (PCIe replay rate, NVLink errors, memory)"]), actions=lambda ctx, config: list(dict.fromkeys(ctx.get("actions") or [])),
    runs_on_short_windows=True)


# --- host-memory-pressure ------------------------------------------------------------------------
def _mem_actions(ctx: dict, config: dict) -> list[str]:
    acts = []
    ws, lim = _f(ctx.get("working_set_bytes")), _f(ctx.get("limit_bytes"))
    if ws is not None and lim is not None and lim > 0:
        acts.append(f"Raise the container's memory limit above {fmt_bytes(ws * 1.25)} (working set "
                    f"{fmt_bytes(ws)} of {fmt_bytes(lim)}), or shrink what the engine holds in host memory.")
    kills = _f(ctx.get("oom_kills"))
    if kills:
        acts.append(f"The kernel OOM-killed {kills:.0f} process(es): the restart was the kernel's, not CUDA's "
                    "(kubectl describe pod shows OOMKilled).")
    return acts


HOST_MEMORY = Diagnosis.from_module(
    host_memory,
    Playbook(
        host_memory.ID, "Host memory pressure",
        "The engine's container is near its memory limit, the kernel's OOM killer ended a process in it, or the "
        "host is short of memory and swapping: the engine dies without a CUDA error, or every step slows.",
        ["If OOM kills happened: raise the container's memory limit and roll the pod; the engine will be killed "
         "again at the same point otherwise."],
        [Action("Shrink vLLM's CPU swap space: --swap-space (GiB per GPU of host memory kept for preempted "
                "sequences; default 4) or 0 where preemption by recompute suffices.",
                ["the engine is vLLM with --swap-space set above what the limit allows"],
                ["workloads with many parallel samples (n > 1, beam search) rely on swapping"]),
         Action("Turn off or shrink CPU offload (--cpu-offload-gb) and multimodal processor caches "
                "(--mm-processor-cache-gb).",
                ["those options are set"],
                ["the model fits on the GPU only with offload: give the container memory instead"]),
         Action("Raise the container's memory limit to the measured working set plus 25 %.",
                ["the node has the memory"], ["nodes packed to their allocatable memory"])],
        ["working set below 80 % of the limit at peak; no new OOM kills (container_oom_events_total flat)",
         "no swap traffic on the host"],
        ["Linux kernel docs: admin-guide/cgroup-v2.rst (memory.max, memory.events oom_kill)",
         "Kubernetes docs: node-pressure eviction (working set)", "vLLM engine arguments: --swap-space, "
         "--cpu-offload-gb"]), actions=_mem_actions, runs_on_short_windows=True)


DIAGNOSES = [CPU_STARVED, STALLED, STRAGGLER, HW_FAULT, HOST_MEMORY]
