#!/usr/bin/env bash
# Where a server's start goes on a GPU host (after install-c.sh): `tandem serve` started twice on the same model
# — a fresh host's first start (MLX's kernel cache empty), then a second (cache warm) — each log line stamped with
# seconds since start, and py-spy dumps of the serving worker every DUMP_S seconds until /health says ready.
# py-spy is carried as a binary (.gpu/spy/py-spy: `cp .venv/bin/py-spy .gpu/spy/` after `uv pip install py-spy`).
# NATIVE=1 adds C/C++ frames to the dumps (NVRTC compiles, module loads).
#   carry [".gpu/c", ".gpu/tok", ".gpu/spy"]: OUT=$OUT bash bench/gpu/startup_h200.sh   → $OUT/start{1,2}.log, dumps{1,2}.txt
set -uo pipefail
OUT=${OUT:-/tmp/start-out}
MODEL=${MODEL:-$HOME/shape/rope}
SPY=${SPY:-.gpu/spy/py-spy}
mkdir -p "$OUT"
[ -d "$MODEL" ] || timeout 90 python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out "$HOME/shape" | tail -1
stamp() { python3 -u -c "import sys,time; t=time.monotonic()
for l in sys.stdin: print(f'{time.monotonic()-t:7.1f} {l}', end='', flush=True)"; }
for n in ${STARTS:-1 2}; do
  port=$((18300 + n))
  python3 -m service.cli serve "$MODEL" --host 127.0.0.1 --port $port --max-active 128 --no-whisper 2>&1 | stamp > "$OUT/start$n.log" &
  t0=$SECONDS
  : > "$OUT/dumps$n.txt"
  while [ $((SECONDS - t0)) -lt ${READY_S:-150} ]; do
    sleep "${DUMP_S:-4}"
    curl -sf "localhost:$port/health" >/dev/null && break
    pid=$(grep -o "worker-1 with PID: [0-9]*" "$OUT/start$n.log" | grep -o "[0-9]*$" | tail -1)
    [ -n "$pid" ] && { echo "=== +$((SECONDS - t0)) s"; timeout 10 "$SPY" dump ${NATIVE:+--native} --pid "$pid" 2>&1 | head -${DUMP_LINES:-60}; } >> "$OUT/dumps$n.txt"
  done
  echo "start $n: ready after $((SECONDS - t0)) s"
  pkill -f "port $port"; wait
done
du -sh "${TMPDIR:-/tmp}/mlx" 2>/dev/null; ls ~/.nv 2>/dev/null
