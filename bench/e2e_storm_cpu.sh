#!/usr/bin/env bash
# Time to a verdict in a preemption storm, cold and warm, against a real vLLM on CPU, beside the engine's
# own alert rule evaluated by a real Prometheus.
#
# Reuses bench/e2e_vllm_cpu.sh's venv, tiny model and server settings (--kv-cache-memory-bytes 4M: a
# 2,048-token pool). In one run:
#   - a warm agent (started with its defaults at the beginning) watches CALM_S seconds of light traffic
#     (CALM_CONC closed-loop workers of 64 tokens: no preemption);
#   - a Prometheus server scrapes the engine every second and evaluates, every second, an alert on the
#     engine's own counter: rate(vllm:num_preemptions_total[1m]) > 0 with `for: 1m` (the baseline);
#   - a cold agent starts COLD_LEAD_S seconds before the storm (no history);
#   - then 40 closed-loop workers of 512 tokens push the pool into a storm while `diagnose URL` starts.
# bench/e2e/storm.py prints the seconds from the engine's first preemption to each agent's
# fragscope_diagnosis_active{diagnosis="kv-cache-pressure"}, to diagnose's first kv-cache-pressure line and
# to the alert firing. Target <= 15 s for fragscope's three (exit 0). Too heavy for CI (docs/e2e.md).
#
#   bench/e2e_storm_cpu.sh                 # E2E_DIR=/tmp/fragscope-e2e CALM_S=240
#   CALM_S=0 bench/e2e_storm_cpu.sh        # cold only (no calm stretch, no second agent)
#   BEFORE_REPO=/tmp/before bench/e2e_storm_cpu.sh   # plus a warm agent from another checkout
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
E2E_DIR=${E2E_DIR:-/tmp/fragscope-e2e}
VENV=$E2E_DIR/venv
MODEL_DIR=$E2E_DIR/tiny-llama
STORM_S=${STORM_S:-100}       # how long the storm runs at most (the alert needs > 60 s)
HEAVY_CONC=${HEAVY_CONC:-40}  # > --max-num-seqs 32 and far more tokens than the 2,048-token pool holds
CALM_S=${CALM_S:-240}         # the warm agent's calm stretch before the storm
CALM_CONC=${CALM_CONC:-2}     # light traffic: 2 x 64 tokens fit the pool many times over
COLD_LEAD_S=${COLD_LEAD_S:-10}  # the cold agent starts this long before the storm
TARGET_S=${TARGET_S:-15}
WINDOW=${WINDOW:-3h}          # the agent's default detect.window
PY=${PYTHON:-python3}
RUN=$E2E_DIR/storm-$(date +%Y%m%d-%H%M%S)

AGENT_TOML=$(cat <<EOF
# storm: the agent's defaults
[detect]
window = "$WINDOW"
EOF
)
source "$REPO/bench/e2e/setup.sh"   # vLLM on $VLLM, the first agent on $AGENT

# --- 5. the baseline: the engine's own counter behind an alert with `for: 1m` ----------------------
PROM_ARGS=()
if command -v prometheus >/dev/null 2>&1; then
  PPORT=$(free_port)
  cat >"$RUN/engine-rules.yml" <<EOF
groups:
  - name: vllm-engine
    interval: 1s
    rules:
      - alert: VllmPreempting
        expr: rate(vllm:num_preemptions_total[1m]) > 0
        for: 1m
EOF
  cat >"$RUN/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $RUN/engine-rules.yml
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: ['127.0.0.1:$VPORT']
EOF
  start_bg "$RUN/prometheus.log" prometheus --config.file="$RUN/prometheus.yml" \
    --storage.tsdb.path="$RUN/prom" --web.listen-address="127.0.0.1:$PPORT"
  PROM_ARGS=(--prometheus "http://127.0.0.1:$PPORT")
  say "Prometheus on 127.0.0.1:$PPORT: alert VllmPreempting = rate(vllm:num_preemptions_total[1m]) > 0, for: 1m"
else
  say "prometheus not installed: no alert-rule baseline (apt-get install prometheus)"
fi

pre_total() { curl -fsS -m 2 "$VLLM/metrics" 2>/dev/null | awk '/^vllm:num_preemptions(_total)?[{ ]/ {s+=$NF} END {print s+0}'; }

# --- 6. calm: light traffic while the warm agent watches; the cold agent starts just before the storm ----
AGENTS=(--agent "cold=$AGENT")  # with no calm stretch, the first agent is the cold one
if [ "$CALM_S" -gt 0 ]; then
  AGENTS=(--agent "warm=$AGENT")
  if [ -n "${BEFORE_REPO:-}" ]; then
    # another checkout's agent (an earlier commit: `git worktree add /tmp/before COMMIT`) beside the warm
    # one, the same config and calm: the figure before a change, in the same run
    BPORT=$(free_port)
    start_bg "$RUN/agent-before.log" env PYTHONPATH="$BEFORE_REPO" "$FRAGSCOPE" agent --config "$RUN/agent.toml" \
      --vllm "$VLLM/metrics" --listen "127.0.0.1:$BPORT" --data-dir "$RUN/agent-before-data" --interval 1s \
      --log-file "$RUN/vllm.log"
    AGENTS+=(--agent "warm_before=http://127.0.0.1:$BPORT")
    say "warm agent from $BEFORE_REPO on 127.0.0.1:$BPORT"
  fi
  P0=$(pre_total)
  say "calm: ${CALM_CONC} x 64 tokens for ${CALM_S} s (the warm agent watches; preemptions so far: $P0)"
  start_bg "$RUN/calm-load.log" "$VPY" "$REPO/bench/e2e/load.py" --url "$VLLM" --concurrency "$CALM_CONC" \
    --max-tokens 64 --duration "$CALM_S" --grace 2
  CALM_PID=$LAST_PID
  sleep $((CALM_S > COLD_LEAD_S ? CALM_S - COLD_LEAD_S : 0))
  CPORT=$(free_port)
  COLD=http://127.0.0.1:$CPORT
  COLD_ARGS=(agent --config "$RUN/agent.toml" --vllm "$VLLM/metrics" --listen "127.0.0.1:$CPORT"
             --data-dir "$RUN/agent-cold-data" --interval 1s --log-file "$RUN/vllm.log")
  start_bg "$RUN/agent-cold.log" "$FRAGSCOPE" "${COLD_ARGS[@]}"
  for _ in $(seq 1 60); do curl -fsS -m 2 "$COLD/readyz" >/dev/null 2>&1 && break; sleep 0.5; done
  say "cold agent ready on $COLD"
  while kill -0 "$CALM_PID" 2>/dev/null; do sleep 0.5; done
  P1=$(pre_total)
  say "calm over: preemptions during it: $(awk -v a="$P0" -v b="$P1" 'BEGIN {print b - a}')"
  AGENTS+=(--agent "cold=$COLD")
fi

# --- 7. the storm ----------------------------------------------------------------------------------
say "storm: ${HEAVY_CONC} x 512 tokens, up to ${STORM_S} s; diagnose $VLLM started at the same moment"
"$VPY" "$REPO/bench/e2e/storm.py" --vllm "$VLLM" "${AGENTS[@]}" "${PROM_ARGS[@]}" --diagnose "$DIAGNOSE" \
  --python "$VPY" --load-py "$REPO/bench/e2e/load.py" --concurrency "$HEAVY_CONC" --duration "$STORM_S" \
  --target "$TARGET_S" --out "$RUN/storm.json"
RC=$?
say "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
say "result: $RUN/storm.json (exit $RC: 0 = every fragscope verdict within ${TARGET_S} s of the first preemption)"
exit $RC
