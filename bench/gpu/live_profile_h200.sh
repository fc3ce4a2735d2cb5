#!/usr/bin/env bash
# bench/gpu/live_h200.sh with py-spy sampling the server worker (every thread, Python stacks) for the whole run,
# once per variant, to see what the event loop and the speech thread do while chat runs beside live sessions.
# After install-c.sh, carrying ["_spy"] (the py-spy wheel, git-ignored) too:
#   VARIANTS="fit:--max-active 64 --live-context fit|whole:--max-active 64 --live-context whole" bash bench/gpu/live_profile_h200.sh
# Writes $OUT/<name>/ (live_h200.sh's files) and $OUT/<name>/prof.raw (py-spy raw: one stack a line, then its count).
set -uo pipefail
OUT=${OUT:-/tmp/bench-out}
VARIANTS=${VARIANTS:-"fit:--max-active 64 --live-context fit"}
mkdir -p "$OUT"
SPY=$(command -v py-spy || echo /tmp/spy/bin/py-spy)
if [ ! -x "$SPY" ] && ls _spy/py_spy-*.whl >/dev/null 2>&1; then
  python3 -c "import zipfile,glob; zipfile.ZipFile(glob.glob('_spy/py_spy-*.whl')[0]).extractall('/tmp/spy')"
  SPY=$(find /tmp/spy -name py-spy -type f | head -1) && chmod +x "$SPY"
fi
IFS='|' read -ra RUNS <<< "$VARIANTS"
for run in "${RUNS[@]}"; do
  name=${run%%:*}; args=${run#*:}
  mkdir -p "$OUT/$name"
  (  # wait for the granian worker, then sample it until it exits
    for _ in $(seq 150); do pid=$(pgrep -f "spawn_main" | head -1); [ -n "$pid" ] && break; sleep 1; done
    [ -n "${pid:-}" ] && timeout 300 "$SPY" record -p "$pid" -d 240 -r "${SPY_RATE:-100}" --threads -f raw \
      -o "$OUT/$name/prof.raw" > "$OUT/$name/spy.log" 2>&1
  ) &
  OUT="$OUT/$name" OURS_ARGS="$args" bash bench/gpu/live_h200.sh > /dev/null 2>&1
  wait
  tail -3 "$OUT/$name/steps.log" | cut -c1-900
done
