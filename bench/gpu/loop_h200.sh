#!/usr/bin/env bash
# What holds the event loop between chat iterations under Poisson arrivals on the H200 (the loop-gap p99 of
# 40-60 ms in /stats), in one step of a device call after install-c.sh (the chat shape built by ab_h200.sh):
#   OUT=$OUT/loop bash bench/gpu/loop_h200.sh
# The server runs with asyncio's debug mode and a slow-callback threshold of SLOW_MS (a sitecustomize on
# PYTHONPATH): every callback or task step that holds the loop longer is logged with its task. With
# SPY=path/to/py-spy, py-spy also records the worker for SPY_S seconds once the load is on (--gil: only the
# thread holding the GIL is sampled, so the profile says who holds it). Writes $OUT/slow.txt, $OUT/spy.txt.
set -uo pipefail
OUT=${OUT:-/tmp/loop-out}
SLOW_MS=${SLOW_MS:-10}
mkdir -p "$OUT" /tmp/asyncdbg
cat > /tmp/asyncdbg/sitecustomize.py <<EOF
import asyncio.base_events
asyncio.base_events.BaseEventLoop.slow_callback_duration = $SLOW_MS / 1000
EOF
SECONDS=0
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }
[ -d "$HOME/shape/rope" ] || timeout 90 python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out "$HOME/shape" | tail -1
step "poisson8 with asyncio's slow-callback log at ${SLOW_MS} ms"
PYTHONPATH=/tmp/asyncdbg:${PYTHONPATH:-} PYTHONASYNCIODEBUG=1 timeout -k 10 ${LOAD_S:-120} python3 -m bench.serve --only ours \
  --model "$HOME/shape/rope" --profile quick --timeout 60 --ready-timeout 90 --log-dir "$OUT" --scenarios "${SCENARIOS:-poisson8}" \
  --ours-args "--max-active 128 --no-whisper" --server-budget $((${LOAD_S:-120} - 15)) --out "$OUT/loop.json" 2>&1 \
  | grep -E "tandem (c|p|:)" | grep -v starting &
LOAD=$!
if [ -n "${SPY:-}" ]; then
  for _ in $(seq 1 300); do pgrep -f "service.cli serve" > /dev/null && break; sleep 0.2; done
  sleep "${SPY_AFTER_S:-15}"  # start-up, warm-up and the benchmark's own first round
  pid=$(pgrep -f "service.cli serve" | head -1)
  step "py-spy on $pid and its worker"
  timeout $((${SPY_S:-15} + 10)) "$SPY" record --pid "$pid" --subprocesses --gil --threads --rate 250 \
    --duration "${SPY_S:-15}" --format raw --output "$OUT/spy.txt" --nonblocking > "$OUT/spy.log" 2>&1 \
    || { step "py-spy failed:"; tail -3 "$OUT/spy.log"; }
fi
wait $LOAD
grep -h "took\|Executing" "$OUT/tandem.log" > "$OUT/slow.txt"
step "slow callbacks: $(wc -l < "$OUT/slow.txt")"
sed -E 's/.*Executing (<[A-Za-z]+ [^ ]*( name=[^ ]*)?).* took ([0-9.]+) seconds.*/\3 \1/' "$OUT/slow.txt" | sort -rn | head -25
python3 -c "
import json; d = json.load(open('$OUT/loop.json'))
for n, s in d['servers']['tandem']['scenarios'].items():
    it = (s.get('server_stats') or {}).get('iteration_times') or {}
    print(n, 'gap', it.get('gap'), '| decode', {k: (it.get('decode') or {}).get(k) for k in ('p50_ms', 'p99_ms', 'max_ms')})
" || true
step "done"
