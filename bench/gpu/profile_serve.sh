#!/usr/bin/env bash
# Profile ours under load on the GPU host: bench/serve.py runs the scenarios while py-spy samples the server
# worker (Python stacks of every thread, native frames too) during c64 and during poisson8.
# Needs py-spy (its wheel in _spy/, git-ignored: pass carry ["_spy"] to the device call) and a model dir ($1).
# Writes $OUT/prof-c64.raw, $OUT/prof-poisson8.raw, $OUT/ours.json. SPY_RATE: samples a second (default 100; at
# 250 with native frames py-spy fell seconds behind, and its poisson8 profile was never written). SPY_FLAGS: more
# py-spy options (--idle: threads waiting, e.g. for the GIL, are sampled too).
# Example, after install-c.sh:  bash bench/gpu/profile_serve.sh $HOME/shape/plain
set -uo pipefail
MODEL=$1
OUT=${OUT:-/tmp/prof-out}
OURS_ARGS=${OURS_ARGS:---max-active 128 --no-whisper}
mkdir -p "$OUT"
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
if [ ! -x "$SPY" ] && ls ${SPY_WHEEL_DIR:-_spy}/py_spy-*.whl >/dev/null 2>&1; then  # the git-ignored wheel, carried along
  python3 -c "import zipfile,glob,sys; zipfile.ZipFile(glob.glob(sys.argv[1]+'/py_spy-*.whl')[0]).extractall('/tmp/spy')" "${SPY_WHEEL_DIR:-_spy}"
  SPY=$(find /tmp/spy -name py-spy -type f | head -1) && chmod +x "$SPY"
fi
record() {  # $1: name, $2: seconds
  local pid
  pid=$(pgrep -f "spawn_main" | head -1)
  [ -n "$pid" ] && timeout $(($2 + 30)) "$SPY" record -p "$pid" -d "$2" -r "${SPY_RATE:-100}" --threads --native ${SPY_FLAGS:-} -f raw \
    -o "$OUT/prof-$1.raw" > "$OUT/spy-$1.log" 2>&1 &
}
# HOOKS: "after=name:seconds ...": when scenario `after` ends, sample `seconds` of the next one as `name`.
SCENARIOS=${SCENARIOS:-c8,c64,poisson8}
HOOKS=${HOOKS:-c8=c64:5 c64=poisson8:10}
timeout 280 python3 -m bench.serve --only ours --model "$MODEL" --profile quick --scenarios "$SCENARIOS" \
  --ours-args "$OURS_ARGS" --server-budget 250 --timeout 60 --ready-timeout 120 --out "$OUT/ours.json" \
  --log-dir "$OUT" 2>&1 | while IFS= read -r line; do
    echo "$line"
    for hook in $HOOKS; do
      after=${hook%%=*} rest=${hook#*=}
      case "$line" in *"tandem $after:"*) record "${rest%%:*}" "${rest##*:}" ;; esac
    done
  done
wait
ls -la "$OUT"
