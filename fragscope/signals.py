"""The signal table: canonical signal ids, and the raw metric names each is read from.

Metric names drift between engine versions and exporters; they live here and nowhere else
(HTA declares each column with the version that introduced it; this is the same idea).
The raw names and the ``fragscope_*`` names are contracts, documented in docs/signals.md.

A canonical signal is read from the first source that has data, converted to base units by
``scale`` (DCGM reports MiB, %, MHz; fragscope exports bytes, ratios, hertz).
"""
from __future__ import annotations

from dataclasses import dataclass

MIB = 1024.0 * 1024.0

# The labelled preemption counter family (recent vLLM), both spellings: with and without `_total`.
VLLM_PREEMPTIONS_BY_REASON = ("vllm:num_preemptions_by_reason_total", "vllm:num_preemptions_by_reason")


@dataclass(frozen=True, slots=True)
class Source:
    metric: str  # raw metric name as exposed (after normalising ray_vllm: -> vllm:)
    scale: float = 1.0  # multiply to get base units
    note: str = ""  # which engine / version exposes it


# What a signal is measured per: the frame keeps GPU-scope signals per GPU and the others once per target
# (engine-wide: one serving engine, its process, its container, its host). A signal of any other scope is an
# error at import, never filed under a GPU by default.
GPU_SCOPE = "gpu"
TARGET_SCOPES = ("engine", "process", "container", "host")
SCOPES = (GPU_SCOPE,) + TARGET_SCOPES
KINDS = ("gauge", "counter", "histogram", "summary", "info")


@dataclass(frozen=True, slots=True)
class Signal:
    id: str
    kind: str  # gauge | counter | histogram | summary | info
    scope: str  # one of SCOPES: gpu, engine, process, container, host
    unit: str
    sources: tuple[Source, ...]
    doc: str = ""
    # False: only some engine versions expose it (a newer family): a scrape without it is not
    # reported as "not exposed" (collectors/vllm.py EXPECTED).
    expected: bool = True

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"signal {self.id}: scope {self.scope!r} is not one of {SCOPES}")
        if self.kind not in KINDS:
            raise ValueError(f"signal {self.id}: kind {self.kind!r} is not one of {KINDS}")


def _s(metric: str, scale: float = 1.0, note: str = "") -> Source:
    return Source(metric, scale, note)


SIGNALS: dict[str, Signal] = {s.id: s for s in [
    # --- serving engine (vLLM V1 / V0; SGLang equivalents where they mean the same) -------------
    Signal("requests_running", "gauge", "engine", "requests",
           (_s("vllm:num_requests_running"), _s("sglang:num_running_reqs", note="SGLang"),
            _s("fragscope_log_requests_running", note="engine log stats lines"),
            _s("tgi_batch_current_size", note="TGI"),
            _s("nv_trt_llm_requests_active", note="TensorRT-LLM backend; derived: request_type=active"))),
    Signal("requests_waiting", "gauge", "engine", "requests",
           (_s("vllm:num_requests_waiting"), _s("sglang:num_queue_reqs", note="SGLang"),
            _s("fragscope_log_requests_waiting", note="engine log stats lines"),
            _s("tgi_queue_size", note="TGI"),
            _s("nv_trt_llm_requests_waiting", note="TensorRT-LLM backend; derived: request_type=waiting"),
            _s("nv_inference_pending_request_count", note="Triton, per model"))),
    Signal("kv_cache_usage_ratio", "gauge", "engine", "ratio",
           (_s("vllm:kv_cache_usage_perc", note="V1 (>=0.9)"),
            _s("vllm:gpu_cache_usage_perc", note="V0; deprecated 0.9"),
            _s("sglang:token_usage", note="SGLang"),
            _s("fragscope_log_kv_cache_usage_ratio", note="engine log stats lines"),
            _s("nv_trt_llm_kv_cache_used_ratio", note="TensorRT-LLM backend; derived: used / max blocks"))),
    Signal("preemptions_total", "counter", "engine", "preemptions",
           (_s("vllm:num_preemptions_total"),
            _s("sglang:num_retracted_requests_total", note="SGLang retractions"),
            _s("fragscope_log_preemptions_total", note="engine log preemption warnings / stats lines"))),
    # Preemptions labelled with why (reason = kv_full | priority | prefix_cache_reset): proposed by vLLM
    # PR #58037 ("[Core] Count preemptions by reason", open when this was written), in no released vLLM:
    # no vLLM source or metrics page searched has the name. Read where a build has it. prometheus_client
    # exposes the counter with `_total`; both spellings. Only kv_full says the pool was too small.
    Signal("preemptions_by_reason_total", "counter", "engine", "preemptions",
           (_s(VLLM_PREEMPTIONS_BY_REASON[0], note="proposed by vLLM PR #58037, in no released vLLM yet; label reason"),
            _s(VLLM_PREEMPTIONS_BY_REASON[1], note="the same family without _total")),
           "all reasons summed; per reason: preemptions_kv_full_total", expected=False),
    Signal("preemptions_kv_full_total", "counter", "engine", "preemptions",
           (_s(VLLM_PREEMPTIONS_BY_REASON[0] + ":kv_full", note="derived: reason=kv_full"),
            _s(VLLM_PREEMPTIONS_BY_REASON[1] + ":kv_full", note="derived: reason=kv_full")),
           "preemptions for lack of free KV blocks (the pool too small for the batch)", expected=False),
    Signal("generation_tokens_total", "counter", "engine", "tokens",
           (_s("vllm:generation_tokens_total"), _s("sglang:generation_tokens_total", note="SGLang"))),
    Signal("prompt_tokens_total", "counter", "engine", "tokens",
           (_s("vllm:prompt_tokens_total"), _s("sglang:prompt_tokens_total", note="SGLang"))),
    Signal("request_success_total", "counter", "engine", "requests",
           (_s("vllm:request_success_total"), _s("sglang:num_requests_total", note="SGLang"),
            _s("tgi_request_success", note="TGI"), _s("nv_inference_request_success", note="Triton, per model"))),
    Signal("ttft_seconds", "histogram", "engine", "seconds",
           (_s("vllm:time_to_first_token_seconds"), _s("sglang:time_to_first_token_seconds", note="SGLang"))),
    Signal("request_prompt_tokens", "histogram", "engine", "tokens",
           (_s("vllm:request_prompt_tokens"), _s("sglang:prompt_tokens_histogram", note="SGLang, optional"),
            _s("tgi_request_input_length", note="TGI"))),
    Signal("request_generation_tokens", "histogram", "engine", "tokens",
           (_s("vllm:request_generation_tokens"), _s("sglang:generation_tokens_histogram", note="SGLang, optional"),
            _s("tgi_request_generated_tokens", note="TGI"))),
    Signal("cache_config_info", "info", "engine", "",
           (_s("vllm:cache_config_info"),),
           "labels block_size, gpu_memory_utilization, num_gpu_blocks (strings); recent vLLM also kv_cache_memory_bytes "
           "(the --kv-cache-memory-bytes setting, 'None' unset) and kv_cache_size_tokens"),
    # --- more engines (SGLang, TGI, Triton, TensorRT-LLM; docs/engines.md) ---------------------------
    Signal("kv_cache_capacity_tokens", "gauge", "engine", "tokens",
           (_s("sglang:max_total_num_tokens", note="SGLang: the KV pool's size"),)),
    Signal("kv_cache_pool_bytes", "gauge", "engine", "bytes",
           (_s("fragscope_log_kv_cache_bytes", note="engine log: the last start-up's KV pool (sizing)"),),
           "what the engine allocated for KV blocks; with the pool's tokens, its bytes per token"),
    Signal("kv_cache_used_tokens", "gauge", "engine", "tokens",
           (_s("sglang:num_used_tokens", note="SGLang"),)),
    Signal("e2e_request_latency_seconds", "histogram", "engine", "seconds",
           (_s("vllm:e2e_request_latency_seconds"), _s("sglang:e2e_request_latency_seconds", note="SGLang"),
            _s("tgi_request_duration", note="TGI"))),
    Signal("inter_token_latency_seconds", "histogram", "engine", "seconds",
           (_s("vllm:inter_token_latency_seconds", note=">= 0.11"),
            _s("vllm:time_per_output_token_seconds", note="before 0.11"),
            _s("sglang:inter_token_latency_seconds", note="SGLang"),
            _s("sglang:time_per_output_token_seconds", note="older SGLang"),
            _s("tgi_request_mean_time_per_token_duration", note="TGI: per-request mean"))),
    Signal("request_queue_seconds", "histogram", "engine", "seconds",
           (_s("vllm:request_queue_time_seconds"), _s("sglang:queue_time_seconds", note="SGLang"),
            _s("tgi_request_queue_duration", note="TGI"))),
    Signal("batch_max_tokens", "gauge", "engine", "tokens",
           (_s("tgi_batch_current_max_tokens", note="TGI: token budget of the running batch"),)),
    Signal("request_failure_total", "counter", "engine", "requests",
           (_s("nv_inference_request_failure", note="Triton, per model"),
            _s("tgi_request_failure", note="TGI, label err"))),
    Signal("inference_count_total", "counter", "engine", "inferences",
           (_s("nv_inference_count", note="Triton: batch elements executed"),),
           "Triton: average batch = rate(inference_count) / rate(exec_count)"),
    Signal("inference_exec_count_total", "counter", "engine", "executions",
           (_s("nv_inference_exec_count", note="Triton: model executions (batches)"),)),
    Signal("inference_request_seconds_total", "counter", "engine", "seconds",
           (_s("nv_inference_request_duration_us", 1e-6, "Triton, cumulative µs"),)),
    Signal("inference_queue_seconds_total", "counter", "engine", "seconds",
           (_s("nv_inference_queue_duration_us", 1e-6, "Triton, cumulative µs"),)),
    Signal("inference_compute_input_seconds_total", "counter", "engine", "seconds",
           (_s("nv_inference_compute_input_duration_us", 1e-6, "Triton, cumulative µs"),)),
    Signal("inference_compute_infer_seconds_total", "counter", "engine", "seconds",
           (_s("nv_inference_compute_infer_duration_us", 1e-6, "Triton, cumulative µs"),)),
    Signal("inference_compute_output_seconds_total", "counter", "engine", "seconds",
           (_s("nv_inference_compute_output_duration_us", 1e-6, "Triton, cumulative µs"),)),
    # --- GPU (fragscope NVML collector, or dcgm-exporter) -----------------------------------------
    Signal("gpu_memory_used_bytes", "gauge", "gpu", "bytes",
           (_s("fragscope_gpu_memory_used_bytes"), _s("DCGM_FI_DEV_FB_USED", MIB, "dcgm-exporter, MiB"),
            _s("nv_gpu_memory_used_bytes", note="Triton"))),
    Signal("gpu_memory_total_bytes", "gauge", "gpu", "bytes",
           (_s("fragscope_gpu_memory_total_bytes"), _s("DCGM_FI_DEV_FB_TOTAL", MIB, "dcgm, not default"),
            _s("nv_gpu_memory_total_bytes", note="Triton")),
           "dcgm-exporter default counters lack FB_TOTAL: derived as FB_USED + FB_FREE (+ FB_RESERVED)"),
    Signal("gpu_memory_free_bytes", "gauge", "gpu", "bytes",
           (_s("fragscope_gpu_memory_free_bytes"), _s("DCGM_FI_DEV_FB_FREE", MIB, "dcgm-exporter, MiB"))),
    Signal("gpu_utilization_ratio", "gauge", "gpu", "ratio",
           (_s("fragscope_gpu_utilization_ratio"), _s("DCGM_FI_DEV_GPU_UTIL", 0.01, "dcgm-exporter, %"),
            _s("nv_gpu_utilization", note="Triton, 0-1"))),
    Signal("gpu_sm_clock_hertz", "gauge", "gpu", "hertz",
           (_s("fragscope_gpu_sm_clock_hertz"), _s("DCGM_FI_DEV_SM_CLOCK", 1e6, "dcgm-exporter, MHz"))),
    Signal("gpu_sm_clock_max_hertz", "gauge", "gpu", "hertz",
           (_s("fragscope_gpu_sm_clock_max_hertz"),)),
    Signal("gpu_temperature_celsius", "gauge", "gpu", "celsius",
           (_s("fragscope_gpu_temperature_celsius"), _s("DCGM_FI_DEV_GPU_TEMP", 1.0, "dcgm-exporter"))),
    Signal("gpu_power_watts", "gauge", "gpu", "watts",
           (_s("fragscope_gpu_power_watts"), _s("DCGM_FI_DEV_POWER_USAGE", 1.0, "dcgm-exporter"),
            _s("nv_gpu_power_usage", note="Triton"))),
    Signal("gpu_power_limit_watts", "gauge", "gpu", "watts", (_s("nv_gpu_power_limit", note="Triton"),)),
    Signal("gpu_energy_joules_total", "counter", "gpu", "joules",
           (_s("nv_energy_consumption", note="Triton, since the server started"),)),
    Signal("gpu_throttle_reason_active", "gauge", "gpu", "bool",
           (_s("fragscope_gpu_throttle_reason_active"),), "label reason, NVML names"),
    Signal("gpu_power_violation_seconds_total", "counter", "gpu", "seconds",
           (_s("DCGM_FI_DEV_POWER_VIOLATION", 1e-9, "dcgm, ns, not default"),)),
    Signal("gpu_thermal_violation_seconds_total", "counter", "gpu", "seconds",
           (_s("DCGM_FI_DEV_THERMAL_VIOLATION", 1e-9, "dcgm, ns, not default"),)),
    # --- GPU hardware health (NVML / dcgm-exporter; docs/diagnoses.md#gpu-hardware-fault) -------------
    Signal("gpu_xid_last", "gauge", "gpu", "xid",
           (_s("fragscope_gpu_last_xid"), _s("DCGM_FI_DEV_XID_ERRORS", note="dcgm-exporter: the last Xid's number")),
           "the number of the last Xid error (0: none since the exporter started); a value, not a count"),
    Signal("gpu_ecc_dbe_volatile_total", "counter", "gpu", "errors",
           (_s("fragscope_gpu_ecc_uncorrected_volatile_total"),
            _s("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", note="dcgm, not default"))),
    Signal("gpu_ecc_sbe_volatile_total", "counter", "gpu", "errors",
           (_s("fragscope_gpu_ecc_corrected_volatile_total"),
            _s("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", note="dcgm, not default"))),
    Signal("gpu_ecc_dbe_aggregate_total", "counter", "gpu", "errors",
           (_s("fragscope_gpu_ecc_uncorrected_aggregate_total"),
            _s("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", note="dcgm, not default")),
           "since the board was made (survives resets)"),
    Signal("gpu_row_remap_pending", "gauge", "gpu", "bool",
           (_s("fragscope_gpu_row_remap_pending"), _s("DCGM_FI_DEV_ROW_REMAP_PENDING", note="dcgm, not default")),
           "a row remap waits for a GPU reset (A100 and later)"),
    Signal("gpu_row_remap_failed", "gauge", "gpu", "bool",
           (_s("fragscope_gpu_row_remap_failed"), _s("DCGM_FI_DEV_ROW_REMAP_FAILURE", note="dcgm-exporter default"))),
    Signal("gpu_remapped_rows_uncorrectable_total", "counter", "gpu", "rows",
           (_s("fragscope_gpu_remapped_rows_uncorrectable_total"),
            _s("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", note="dcgm-exporter default"))),
    Signal("gpu_retired_pages_pending", "gauge", "gpu", "bool",
           (_s("fragscope_gpu_retired_pages_pending"), _s("DCGM_FI_DEV_RETIRED_PENDING", note="dcgm, pre-Ampere")),
           "a page retirement waits for a reset (Volta / Turing)"),
    Signal("gpu_retired_pages_dbe_total", "counter", "gpu", "pages",
           (_s("fragscope_gpu_retired_pages_dbe_total"), _s("DCGM_FI_DEV_RETIRED_DBE", note="dcgm, pre-Ampere"))),
    Signal("gpu_pcie_link_gen", "gauge", "gpu", "generation",
           (_s("fragscope_gpu_pcie_link_gen"), _s("DCGM_FI_DEV_PCIE_LINK_GEN", note="dcgm, not default"))),
    Signal("gpu_pcie_link_gen_max", "gauge", "gpu", "generation",
           (_s("fragscope_gpu_pcie_link_gen_max"), _s("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", note="dcgm, not default"))),
    Signal("gpu_pcie_link_width", "gauge", "gpu", "lanes",
           (_s("fragscope_gpu_pcie_link_width"), _s("DCGM_FI_DEV_PCIE_LINK_WIDTH", note="dcgm, not default"))),
    Signal("gpu_pcie_link_width_max", "gauge", "gpu", "lanes",
           (_s("fragscope_gpu_pcie_link_width_max"), _s("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", note="dcgm, not default"))),
    Signal("gpu_pcie_replays_total", "counter", "gpu", "replays",
           (_s("fragscope_gpu_pcie_replays_total"), _s("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", note="dcgm-exporter default"))),
    Signal("gpu_nvlink_errors_total", "counter", "gpu", "errors",
           (_s("fragscope_gpu_nvlink_errors_total"),
            _s("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", note="dcgm, not default"),
            _s("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", note="dcgm, not default")),
           "CRC data (else flow-control) errors over all links"),
    # --- the engine's container, processes and host (collectors/process.py, collectors/cgroup.py) ---
    Signal("container_cpu_quota_cores", "gauge", "container", "cores",
           (_s("fragscope_container_cpu_quota_cores"),), "cgroup cpu.max / cpu.cfs_quota_us; absent: no limit"),
    Signal("container_cpu_periods_total", "counter", "container", "periods",
           (_s("fragscope_container_cpu_periods_total"),
            _s("container_cpu_cfs_periods_total", note="cAdvisor / kubelet"))),
    Signal("container_cpu_throttled_periods_total", "counter", "container", "periods",
           (_s("fragscope_container_cpu_throttled_periods_total"),
            _s("container_cpu_cfs_throttled_periods_total", note="cAdvisor / kubelet"))),
    Signal("container_cpu_throttled_seconds_total", "counter", "container", "seconds",
           (_s("fragscope_container_cpu_throttled_seconds_total"),
            _s("container_cpu_cfs_throttled_seconds_total", note="cAdvisor / kubelet"))),
    Signal("container_cpu_usage_seconds_total", "counter", "container", "seconds",
           (_s("fragscope_container_cpu_usage_seconds_total"),)),
    Signal("process_runqueue_wait_seconds_total", "counter", "process", "seconds",
           (_s("fragscope_process_runqueue_wait_seconds_total"),),
           "engine threads' time runnable but waiting for a CPU (/proc/PID/task/*/schedstat), summed over pids"),
    Signal("process_cpu_seconds_total", "counter", "process", "seconds",
           (_s("fragscope_process_cpu_seconds_total"),), "engine processes' user + system CPU, summed over pids"),
    Signal("process_stopped_processes", "gauge", "process", "processes",
           (_s("fragscope_process_stopped_processes"),),
           "engine processes in state T or t (/proc/PID/stat: stopped by a signal or a debugger), summed over "
           "pids; absent when /proc is unreadable"),
    Signal("process_resident_memory_bytes", "gauge", "process", "bytes",
           (_s("fragscope_process_resident_memory_bytes"),), "engine processes' RSS, summed over pids"),
    Signal("container_memory_working_set_bytes", "gauge", "container", "bytes",
           (_s("fragscope_container_memory_working_set_bytes"),
            _s("container_memory_working_set_bytes", note="cAdvisor / kubelet")),
           "usage minus inactive file pages: what the kubelet evicts on and the OOM killer approaches"),
    Signal("container_memory_limit_bytes", "gauge", "container", "bytes",
           (_s("fragscope_container_memory_limit_bytes"),
            _s("container_spec_memory_limit_bytes", note="cAdvisor; 0 = no limit")),
           "absent (or 0 from cAdvisor): no limit"),
    Signal("container_memory_swap_bytes", "gauge", "container", "bytes",
           (_s("fragscope_container_memory_swap_bytes"), _s("container_memory_swap", note="cAdvisor"))),
    Signal("container_oom_kills_total", "counter", "container", "kills",
           (_s("fragscope_container_oom_kills_total"), _s("container_oom_events_total", note="cAdvisor")),
           "processes the kernel's OOM killer ended in the engine's cgroup"),
    Signal("host_memory_available_bytes", "gauge", "host", "bytes",
           (_s("fragscope_host_memory_available_bytes"), _s("node_memory_MemAvailable_bytes", note="node_exporter"))),
    Signal("host_memory_total_bytes", "gauge", "host", "bytes",
           (_s("fragscope_host_memory_total_bytes"), _s("node_memory_MemTotal_bytes", note="node_exporter"))),
    Signal("host_swap_in_bytes_total", "counter", "host", "bytes",
           (_s("fragscope_host_swap_in_bytes_total"),)),
    Signal("host_swap_out_bytes_total", "counter", "host", "bytes",
           (_s("fragscope_host_swap_out_bytes_total"),)),
    # --- PyTorch caching allocator (fragscope probe, in the engine process) ------------------------
    Signal("torch_allocated_bytes", "gauge", "gpu", "bytes", (_s("fragscope_torch_allocated_bytes"),)),
    Signal("torch_reserved_bytes", "gauge", "gpu", "bytes", (_s("fragscope_torch_reserved_bytes"),)),
    Signal("torch_inactive_split_bytes", "gauge", "gpu", "bytes", (_s("fragscope_torch_inactive_split_bytes"),)),
    Signal("torch_alloc_retries_total", "counter", "gpu", "retries", (_s("fragscope_torch_alloc_retries_total"),)),
    Signal("torch_ooms_total", "counter", "gpu", "ooms", (_s("fragscope_torch_ooms_total"),)),
    # --- kernel timeline (periodic short captures) -------------------------------------------------
    Signal("kernel_gap_seconds", "summary", "gpu", "seconds", (_s("fragscope_kernel_gap_seconds"),),
           "quantile label 0.5 / 0.99"),
    Signal("gpu_idle_ratio", "gauge", "gpu", "ratio", (_s("fragscope_gpu_idle_ratio"),)),
]}

# Raw metric name -> (signal id, source). Built once.
RAW_TO_SIGNAL: dict[str, tuple[str, Source]] = {}
for _sig in SIGNALS.values():
    for _src in _sig.sources:
        RAW_TO_SIGNAL.setdefault(_src.metric, (_sig.id, _src))

# Prefixes rewritten at ingest so one table serves every deployment.
PREFIX_ALIASES: tuple[tuple[str, str], ...] = (
    ("ray_vllm:", "vllm:"),  # Ray Serve LLM re-export
)


@dataclass(frozen=True, slots=True)
class Derived:
    """A raw name the table reads that an engine does not expose as such: one label value of a
    family (``select``), or the ratio of two (``select`` / ``per``), made at ingest by
    :func:`fragscope.collectors.engines.derive` (series matched on their other labels)."""

    metric: str  # the derived name, listed as a Source above
    family: str  # the engine's raw metric family
    select: tuple[tuple[str, str], ...]  # label matchers for the value (the numerator)
    per: tuple[tuple[str, str], ...] = ()  # label matchers for the denominator; () = no ratio
    note: str = ""


DERIVED: tuple[Derived, ...] = (
    # TensorRT-LLM backend: block counts per kv_cache_block_type (max / free / used / tokens_per); the
    # "fraction" type's meaning is undocumented, so usage is read as used / max.
    Derived("nv_trt_llm_kv_cache_used_ratio", "nv_trt_llm_kv_cache_block_metrics",
            (("kv_cache_block_type", "used"),), (("kv_cache_block_type", "max"),), "used / max KV blocks"),
    # vLLM's labelled preemptions: the kv_full reason alone (the pool ran out of blocks)
    *(Derived(fam + ":kv_full", fam, (("reason", "kv_full"),), note="preemptions for lack of KV blocks")
      for fam in VLLM_PREEMPTIONS_BY_REASON),
    Derived("nv_trt_llm_requests_active", "nv_trt_llm_request_metrics", (("request_type", "active"),)),
    Derived("nv_trt_llm_requests_waiting", "nv_trt_llm_request_metrics", (("request_type", "waiting"),)),
)

# Labels under which one scheduler's figures are repeated by each of its ranks (SGLang's
# --enable-metrics-for-all-schedulers: every TP rank reports the same counters). Series differing
# only in these are one series (the maximum), not several engines to add up.
RANK_DUPLICATE_LABELS: dict[str, tuple[str, ...]] = {"sglang:": ("tp_rank",)}

# Labels that identify a GPU across exporters: fragscope & dcgm use ``gpu`` (index);
# ``gpu_uuid`` (fragscope) / ``UUID`` (dcgm) identify it globally.
GPU_LABELS = ("gpu", "gpu_uuid", "UUID")
# Labels that identify an engine inside a pod.
ENGINE_LABELS = ("model_name", "engine")
# Labels that identify a serving target in a fleet (Prometheus / Kubernetes).
TARGET_LABELS = ("namespace", "pod")

# DCGM reports "blank" values as huge sentinels (README: MEMORY_TEMP = 9223372036854775794).
DCGM_BLANK_THRESHOLD = 9.0e18


# Exporter metrics the frame reads beside the table (not canonical signals of their own).
DCGM_FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"  # MiB, added to used + free for the total
DCGM_REASON_BITMASKS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")  # new, old name
# DCGM violation counters (ns of throttling) -> the NVML reason they stand for
DCGM_VIOLATION_REASONS = {"DCGM_FI_DEV_POWER_VIOLATION": "sw_power_cap",
                          "DCGM_FI_DEV_THERMAL_VIOLATION": "sw_thermal_slowdown"}
# What tells vLLM's engine generations apart (V1 renamed the KV gauge and added the `engine` label).
VLLM_V1_KV = "vllm:kv_cache_usage_perc"
VLLM_V0_KV = "vllm:gpu_cache_usage_perc"
VLLM_RUNNING = "vllm:num_requests_running"


# What a finding says when it asks for the preemption reason: the counter is not in a released vLLM.
BY_REASON_AVAILABILITY = ("proposed by vLLM PR #58037, in no released vLLM yet; until then the engine log's "
                          "preemption warnings are the only record of why")


def wanted_by_reason() -> str:
    """The "missing" entry that asks for the preemption reason, saying which vLLM exports it (none released)."""
    return f"{SIGNALS['preemptions_by_reason_total'].sources[0].metric}{{reason}} ({BY_REASON_AVAILABILITY})"


def primary(sig_id: str) -> str:
    """The first raw metric a canonical signal is read from (what a "missing" list names)."""
    return SIGNALS[sig_id].sources[0].metric


def any_of(sig_id: str, engine_only: bool = True) -> str:
    """Every raw name of a signal as one "missing" entry: "vllm:a or vllm:b or sglang:c"."""
    names = [s.metric for s in SIGNALS[sig_id].sources
             if not (engine_only and s.metric.startswith("fragscope_log_"))]
    return " or ".join(names)


def normalise_name(name: str) -> str:
    for old, new in PREFIX_ALIASES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def markdown() -> str:
    """docs/signals.md, generated from this table (tests check the committed file matches)."""
    lines = ["# Signals (contract)", "",
             "fragscope reads each *canonical signal* from the first raw metric below that has data and converts",
             "it to base units (bytes, seconds, hertz, ratios 0–1). The raw names and the `fragscope_*` names are",
             "contracts: the agent's exporter (docs/agent.md) publishes the `fragscope_*` ones, the dashboards and",
             "rules (docs/dashboards.md) query them. Generated from `fragscope/signals.py` by",
             "`python -m fragscope.signals > docs/signals.md`.", "",
             "Labels: GPU signals carry `gpu` (index) and `gpu_uuid` (fragscope) or `UUID` (dcgm-exporter);",
             "allocator signals carry `pid` and `gpu`; engine signals carry `model_name` (and `engine` on vLLM V1).",
             "Ray Serve's `ray_vllm:` prefix is read as `vllm:`. DCGM blank sentinels (> 9e18) are dropped: not",
             "available, not a value. Counters are read as reset-aware rates (a drop means a restart); histograms",
             "through their `_bucket`, `_sum` and `_count` series.", "",
             "| signal | kind | scope | unit | raw sources (first with data wins; × scale to base units) |",
             "|---|---|---|---|---|"]
    for s in SIGNALS.values():
        src = "<br>".join(f"`{x.metric}`" + (f" ×{x.scale:g}" if x.scale != 1 else "") +
                          (f" ({x.note})" if x.note else "") for x in s.sources)
        lines.append(f"| `{s.id}` | {s.kind} | {s.scope} | {s.unit} | {src}{'<br>' + s.doc if s.doc else ''} |")
    lines += ["", "## Derived signals (the detectors' frame; the agent exports the first)", "",
              "| name | definition |", "|---|---|",
              "| `torch_fragmentation_ratio` | (reserved − allocated) / reserved per GPU, summed over pids; "
              "exported as `fragscope_torch_fragmentation_ratio` |",
              "| `torch_inactive_split_ratio` | inactive_split_bytes / reserved_bytes per GPU |",
              "| `generation_tokens_per_second` | reset-aware rate of `generation_tokens_total` over 2 min, summed "
              "over engines |",
              "| `preemptions_per_minute` | reset-aware rate of `preemptions_total` |",
              "| `ttft_p50_seconds`, `ttft_p99_seconds` | histogram_quantile over 5-minute bucket increases "
              "(Prometheus' interpolation) |",
              "| `request_prompt_tokens_mean`, `request_generation_tokens_mean` | rate(_sum) / rate(_count) |",
              "| `kernel_gap_p50_seconds`, `kernel_gap_p99_seconds` | `fragscope_kernel_gap_seconds` quantiles 0.5 "
              "and 0.99 (sparse: 20-minute lookback) |",
              "| `gpu_memory_total_bytes` from DCGM | `DCGM_FI_DEV_FB_USED + FB_FREE (+ FB_RESERVED)` when FB_TOTAL "
              "is absent |"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
