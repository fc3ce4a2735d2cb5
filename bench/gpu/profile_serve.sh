#!/usr/bin/env bash
# Profile ours under load on the GPU host: bench/serve.py runs the scenarios while py-spy samples the server
# worker (Python stacks of every thread, native frames too) during c64 and during poisson8.
# Needs py-spy (carry its wheel in .whl) and a model dir ($1). Writes $OUT/prof-c64.raw, $OUT/prof-poisson8.raw,
# $OUT/ours.json. Example, after install-c.sh:  bash bench/gpu/profile_serve.sh $HOME/shape/plain
set -uo pipefail
MODEL=$1
OUT=${OUT:-/tmp/prof-out}
OURS_ARGS=${OURS_ARGS:---max-active 128 --no-whisper}
mkdir -p "$OUT"
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
record() {  # $1: name, $2: seconds
  local pid
  pid=$(pgrep -f "spawn_main" | head -1)
  [ -n "$pid" ] && timeout $(($2 + 15)) "$SPY" record -p "$pid" -d "$2" -r 250 --threads --native -f raw \
    -o "$OUT/prof-$1.raw" > "$OUT/spy-$1.log" 2>&1 &
}
timeout 280 python3 -m bench.serve --only ours --model "$MODEL" --profile quick --scenarios c8,c64,poisson8 \
  --ours-args "$OURS_ARGS" --server-budget 250 --timeout 60 --ready-timeout 120 --out "$OUT/ours.json" \
  --log-dir "$OUT" 2>&1 | while IFS= read -r line; do
    echo "$line"
    case "$line" in
      *"tandem c8:"*) record c64 5 ;;
      *"tandem c64:"*) record poisson8 10 ;;
    esac
  done
wait
ls -la "$OUT"
