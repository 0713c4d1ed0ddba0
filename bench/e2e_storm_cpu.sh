#!/usr/bin/env bash
# Time to detection of a preemption storm from a cold start (issue 10), against a real vLLM on CPU.
#
# Reuses bench/e2e_vllm_cpu.sh's venv, tiny model and server settings (--kv-cache-memory-bytes 4M: a
# 2,048-token pool), starts `fragscope agent` with its defaults, then at once pushes 40 closed-loop workers
# of 512 tokens each (a storm: the pool holds ~4 sequences) while `diagnose URL` starts against the engine.
# bench/e2e/storm.py prints the seconds from the engine's first preemption to the agent's
# fragscope_diagnosis_active{diagnosis="kv-cache-pressure"} and to diagnose's first kv-cache-pressure line.
# Target <= 30 s for both, no warm-up. Too heavy for CI (see docs/e2e.md).
#
#   bench/e2e_storm_cpu.sh                 # E2E_DIR=/tmp/fragscope-e2e
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
E2E_DIR=${E2E_DIR:-/tmp/fragscope-e2e}
VENV=$E2E_DIR/venv
MODEL_DIR=$E2E_DIR/tiny-llama
STORM_S=${STORM_S:-120}       # how long the storm runs (the targets are 30 s)
HEAVY_CONC=${HEAVY_CONC:-40}  # > --max-num-seqs 32 and far more tokens than the 2,048-token pool holds
WINDOW=${WINDOW:-3h}          # the agent's default detect.window
PY=${PYTHON:-python3}
RUN=$E2E_DIR/storm-$(date +%Y%m%d-%H%M%S)

AGENT_TOML=$(cat <<EOF
# storm: the agent's defaults (a fresh agent has no history: the level checks must answer)
[detect]
window = "$WINDOW"
EOF
)
source "$REPO/bench/e2e/setup.sh"

# --- 5. the storm, straight from cold ------------------------------------------------------------
say "storm: ${HEAVY_CONC} x 512 tokens straight away, ${STORM_S} s; diagnose $VLLM started at the same moment"
"$VPY" "$REPO/bench/e2e/storm.py" --vllm "$VLLM" --agent "$AGENT" --diagnose "$DIAGNOSE" --python "$VPY" \
  --load-py "$REPO/bench/e2e/load.py" --concurrency "$HEAVY_CONC" --duration "$STORM_S" --out "$RUN/storm.json"
RC=$?
say "result: $RUN/storm.json (exit $RC: 0 = both within 30 s of the first preemption)"
exit $RC
