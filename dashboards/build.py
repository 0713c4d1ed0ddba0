#!/usr/bin/env python3
"""Generate dashboards/fragscope.json with grafana-foundation-sdk (Grafana's typed builders).

    python dashboards/build.py            # rewrite dashboards/fragscope.json
    python dashboards/build.py --check    # exit 1 if the committed JSON differs from a fresh build

The JSON is committed so that Grafana users need nothing but the file (import it, or provision it:
dashboards/provisioning/fragscope.yaml). tests/test_dashboards.py checks the committed file equals a
fresh build, and runs every panel query against a real Prometheus. Panels and variables: docs/dashboards.md.

Queries work with vLLM V1 and V0 names (``or`` fallbacks: ``vllm:kv_cache_usage_perc`` /
``vllm:gpu_cache_usage_perc``) and with dcgm-exporter instead of fragscope's NVML collector
(``DCGM_FI_*`` in MiB / MHz, scaled to bytes / hertz), including dcgm-exporter scraped without
``honor_labels`` (the workload's pod in ``exported_pod``).
"""
from __future__ import annotations

import json
import os
import sys

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pq
from grafana_foundation_sdk.builders import statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT = os.path.join(HERE, "fragscope.json")
UID = "fragscope-serving"

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
POD = 'namespace=~"$namespace",pod=~"$pod"'
ENGINE = POD + ',model_name=~"$model"'
GPU = POD + ',gpu=~"$gpu"'
BY_POD = "namespace, pod"
BY_ENGINE = "namespace, pod, model_name"
BY_GPU = "namespace, pod, gpu"
MIB = 1048576


def gpu_metric(fragscope_name: str, dcgm_name: str, scale: float) -> str:
    """fragscope's NVML series, else dcgm-exporter's (scaled to base units), per pod and GPU.

    dcgm-exporter with Kubernetes mapping labels series with the workload's ``pod``; scraped
    without ``honor_labels`` Prometheus renames those to ``exported_pod`` / ``exported_namespace``,
    which the third branch maps back.
    """
    s = "" if scale == 1 else f" * {scale:g}"
    return (
        f"max by ({BY_GPU}) ({fragscope_name}{{{GPU}}})\n"
        f"or max by ({BY_GPU}) ({dcgm_name}{{{GPU},exported_pod=\"\"}}){s}\n"
        f"or max by ({BY_GPU}) (label_replace(label_replace({dcgm_name}{{exported_namespace=~\"$namespace\","
        f"exported_pod=~\"$pod\",gpu=~\"$gpu\"}}, \"pod\", \"$1\", \"exported_pod\", \"(.+)\"), "
        f"\"namespace\", \"$1\", \"exported_namespace\", \"(.+)\")){s}"
    )


def q(ref: str, expr: str, legend: str) -> pq.Dataquery:
    return pq.Dataquery().ref_id(ref).expr(expr).legend_format(legend).range()


def right_axis(ref: str, unit: str, **extra) -> tuple[str, list[dm.DynamicConfigValue]]:
    props = [dm.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
             dm.DynamicConfigValue(id_val="unit", value=unit)]
    for k, v in extra.items():
        props.append(dm.DynamicConfigValue(id_val=k, value=v))
    return ref, props


def ts_panel(title: str, desc: str, unit: str, targets: list[pq.Dataquery], pos: tuple[int, int, int, int],
             overrides: list[tuple[str, list[dm.DynamicConfigValue]]] = (), min_val: float | None = None,
             max_val: float | None = None) -> timeseries.Panel:
    x, y, w, h = pos
    p = (timeseries.Panel().title(title).description(desc).datasource(DS).unit(unit)
         .grid_pos(dm.GridPos(h=h, w=w, x=x, y=y)).line_width(1).fill_opacity(5)
         .span_nulls(False))
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    for t in targets:
        p = p.with_target(t)
    for ref, props in overrides:
        p = p.override_by_query(ref, props)
    return p


def state_panel(title: str, desc: str, target: pq.Dataquery, pos, mapping: dict[str, tuple[str, str]]):
    x, y, w, h = pos
    vm = dm.ValueMap(options={k: dm.ValueMappingResult(text=t, color=c, index=i)
                              for i, (k, (t, c)) in enumerate(mapping.items())})
    return (statetimeline.Panel().title(title).description(desc).datasource(DS)
            .grid_pos(dm.GridPos(h=h, w=w, x=x, y=y)).with_target(target).mappings([vm])
            .show_value(common_visibility_auto()).merge_values(True))


def common_visibility_auto():
    from grafana_foundation_sdk.models import common

    return common.VisibilityMode.AUTO


def variables() -> list:
    def qv(name: str, label: str, query: str) -> db.QueryVariable:
        return (db.QueryVariable(name).label(label).datasource(DS).query(query)
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
                .include_all(True).all_value(".*").multi(True)
                .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"])))

    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        qv("namespace", "Namespace", "label_values(vllm:num_requests_running, namespace)"),
        qv("pod", "Pod", 'label_values(vllm:num_requests_running{namespace=~"$namespace"}, pod)'),
        qv("model", "Model", 'label_values(vllm:num_requests_running{namespace=~"$namespace",pod=~"$pod"}, model_name)'),
        qv("gpu", "GPU", 'label_values({__name__=~"fragscope_gpu_memory_used_bytes|DCGM_FI_DEV_FB_USED",'
                         'namespace=~"$namespace"}, gpu)'),
    ]


def panels() -> list:
    rate = "$__rate_interval"
    out = []
    # --- row 0: the headline figure -----------------------------------------------------------
    frag = (f"max by ({BY_GPU}) (fragscope_torch_fragmentation_ratio{{{GPU}}})\n"
            f"or max by ({BY_GPU}) (1 - sum by ({BY_GPU}) (fragscope_torch_allocated_bytes{{{GPU}}})\n"
            f"  / (sum by ({BY_GPU}) (fragscope_torch_reserved_bytes{{{GPU}}}) > 0))")
    out.append(ts_panel(
        "Throughput vs allocator fragmentation",
        "Generated tokens/s (left) against the share of PyTorch-reserved memory not allocated (right). "
        "Fragmentation shows here, not in NVML used: the serving engine pre-allocates the KV cache.",
        "short",
        [q("A", f"sum by ({BY_POD}) (rate(vllm:generation_tokens_total{{{ENGINE}}}[{rate}]))",
           "{{pod}} tokens/s"),
         q("B", frag, "{{pod}} GPU {{gpu}} fragmentation")],
        (0, 0, 24, 9), overrides=[right_axis("B", "percentunit", min=0, max=1)], min_val=0))
    # --- row 1: memory, preemptions ---------------------------------------------------------
    out.append(ts_panel(
        "GPU memory: allocated / reserved / NVML used",
        "PyTorch allocator allocated and reserved bytes (fragscope probe) and device memory used "
        "(fragscope NVML collector, else dcgm-exporter FB_USED).",
        "bytes",
        [q("A", f"sum by ({BY_GPU}) (fragscope_torch_allocated_bytes{{{GPU}}})", "{{pod}} GPU {{gpu}} allocated"),
         q("B", f"sum by ({BY_GPU}) (fragscope_torch_reserved_bytes{{{GPU}}})", "{{pod}} GPU {{gpu}} reserved"),
         q("C", gpu_metric("fragscope_gpu_memory_used_bytes", "DCGM_FI_DEV_FB_USED", MIB),
           "{{pod}} GPU {{gpu}} NVML used")],
        (0, 9, 12, 8), min_val=0))
    out.append(ts_panel(
        "Preemptions per minute",
        "vLLM preemptions (KV cache full: requests evicted and recomputed).",
        "short",
        [q("A", f"60 * sum by ({BY_ENGINE}) (rate(vllm:num_preemptions_total{{{ENGINE}}}[{rate}]))",
           "{{pod}} {{model_name}}")],
        (12, 9, 12, 8), min_val=0))
    # --- row 2: KV cache, queue -------------------------------------------------------------
    out.append(ts_panel(
        "KV-cache usage",
        "Share of KV-cache blocks in use (vLLM V1 kv_cache_usage_perc, V0 gpu_cache_usage_perc).",
        "percentunit",
        [q("A", f"max by ({BY_ENGINE}, engine) (vllm:kv_cache_usage_perc{{{ENGINE}}})\n"
                f"or max by ({BY_ENGINE}, engine) (vllm:gpu_cache_usage_perc{{{ENGINE}}})",
           "{{pod}} {{model_name}}")],
        (0, 17, 12, 8), min_val=0, max_val=1))
    out.append(ts_panel(
        "Requests running and waiting",
        "Running batch and queue. A shrinking batch at unchanged traffic is a sick server, not a busy one.",
        "short",
        [q("A", f"sum by ({BY_ENGINE}) (vllm:num_requests_running{{{ENGINE}}})", "{{pod}} running"),
         q("B", f"sum by ({BY_ENGINE}) (vllm:num_requests_waiting{{{ENGINE}}})", "{{pod}} waiting")],
        (12, 17, 12, 8), min_val=0))
    # --- row 3: latency, kernel gaps ------------------------------------------------------------
    ttft = "histogram_quantile({q}, sum by ({by}, le) (rate(vllm:time_to_first_token_seconds_bucket{{{m}}}[{r}])))"
    out.append(ts_panel(
        "Time to first token p50 / p99",
        "KV pressure shows as a p99 spike while p50 stays healthy.",
        "s",
        [q("A", ttft.format(q="0.5", by=BY_ENGINE, m=ENGINE, r=rate), "{{pod}} p50"),
         q("B", ttft.format(q="0.99", by=BY_ENGINE, m=ENGINE, r=rate), "{{pod}} p99")],
        (0, 25, 12, 8), min_val=0))
    out.append(ts_panel(
        "Kernel gaps p50 / p99 and GPU idle share",
        "From periodic short trace captures (sparse: one point every few minutes, held 15 minutes). "
        "Wide gaps with an idle GPU and no preemptions: launch-bound.",
        "s",
        [q("A", f'max by ({BY_GPU}) (last_over_time(fragscope_kernel_gap_seconds{{{GPU},quantile="0.5"}}[15m]))',
           "{{pod}} GPU {{gpu}} gap p50"),
         q("B", f'max by ({BY_GPU}) (last_over_time(fragscope_kernel_gap_seconds{{{GPU},quantile="0.99"}}[15m]))',
           "{{pod}} GPU {{gpu}} gap p99"),
         q("C", f"max by ({BY_GPU}) (last_over_time(fragscope_gpu_idle_ratio{{{GPU}}}[15m]))",
           "{{pod}} GPU {{gpu}} idle")],
        (12, 25, 12, 8), overrides=[right_axis("C", "percentunit", min=0, max=1)], min_val=0))
    # --- row 4: clocks ------------------------------------------------------------------------
    out.append(ts_panel(
        "SM clock and temperature",
        "SM clock (left) and GPU temperature (right), fragscope NVML collector or dcgm-exporter.",
        "hertz",
        [q("A", gpu_metric("fragscope_gpu_sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK", 1e6), "{{pod}} GPU {{gpu}} SM clock"),
         q("B", gpu_metric("fragscope_gpu_temperature_celsius", "DCGM_FI_DEV_GPU_TEMP", 1),
           "{{pod}} GPU {{gpu}} temperature")],
        (0, 33, 12, 8), overrides=[right_axis("B", "celsius")], min_val=0))
    out.append(state_panel(
        "Clock throttle reasons",
        "NVML clock-event reasons active per GPU (fragscope NVML collector).",
        q("A", f"max by ({BY_GPU}, reason) (fragscope_gpu_throttle_reason_active{{{GPU}}})",
          "{{pod}} GPU {{gpu}} {{reason}}"),
        (12, 33, 12, 8), {"0": ("off", "transparent"), "1": ("active", "orange")}))
    # --- row 5: fragscope's own view ------------------------------------------------------------
    # fragscope_diagnosis_severity is 1 info, 2 warning, 3 critical while the diagnosis is active.
    sev = f"max by ({BY_POD}, diagnosis) (fragscope_diagnosis_severity{{{POD}}})"
    out.append(state_panel(
        "Active diagnoses",
        "fragscope's findings over time (diagnose explain ID prints the playbook).",
        q("A", sev, "{{pod}} {{diagnosis}}"),
        (0, 41, 16, 9), {"0": ("clear", "green"), "1": ("info", "blue"), "2": ("warning", "orange"),
                         "3": ("critical", "red")}))
    out.append(state_panel(
        "fragscope collectors",
        "Whether each of the agent's collectors could read its source.",
        q("A", f"min by ({BY_POD}, collector) (fragscope_collector_up{{{POD}}})", "{{pod}} {{collector}}"),
        (16, 41, 8, 9), {"0": ("down", "red"), "1": ("up", "green")}))
    return out


def build() -> dict:
    d = (db.Dashboard("fragscope: GPU model serving").uid(UID)
         .description("Why a serving pod got slow or ran out of memory: throughput against allocator "
                      "fragmentation, KV-cache pressure, kernel gaps, clocks, and fragscope's diagnoses.")
         .tags(["fragscope", "vllm", "gpu"]).editable().time("now-6h", "now").refresh("30s")
         .timezone("browser").tooltip(dm.DashboardCursorSync.CROSSHAIR))
    for v in variables():
        d = d.with_variable(v)
    for p in panels():
        d = d.with_panel(p)
    built = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    # Panel ids: stable, unique (Grafana assigns them on save otherwise, which would churn the file).
    for i, p in enumerate(built.get("panels", []), 1):
        p["id"] = i
    return built


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        try:
            with open(OUTPUT, encoding="utf-8") as fh:
                same = fh.read() == text
        except OSError:
            same = False
        if not same:
            print(f"{OUTPUT} is stale: run python dashboards/build.py", file=sys.stderr)
            return 1
        return 0
    with open(OUTPUT, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
