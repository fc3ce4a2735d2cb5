#!/usr/bin/env bash
# Whisper's decoder forward on the lent H200, in ONE device call right after install-c.sh:
#   bash .gpu/c/install-c.sh && export PYTHONPATH=$HOME/mlx-site:$PWD TANDEM_BLAS=reference PYTHONUNBUFFERED=1 \
#     && bash bench/gpu/forward_h200.sh
# 1. bench/decode_forward.py on the random-init turbo shape: one forward of R rows per way of running it
#    (attention per row, the batch as built, the batch compiled), the modes in turn (ROUNDS).
#    (SKIP_FORWARD=1: not this step)
# 2. unless SKIP_LIVE=1: bench/gpu/live_h200.sh's speaker rounds (SPEAKERS, default 16; no chat round) once per
#    VARIANTS entry ("name|ENV=VALUE ..." separated by ';', default: the defaults, then the batch uncompiled).
# Writes $OUT/forward.json, $OUT/forward.log, $OUT/<variant>/live.json and steps.log.
set -uo pipefail
OUT=${OUT:-/tmp/forward-out}
mkdir -p "$OUT"
source bench/gpu/shapes.sh
build_shapes || exit 1
if [ -z "${SKIP_FORWARD:-}" ]; then
step "decoder forwards ($WSHAPE)"
timeout ${FORWARD_S:-150} python3 -m bench.decode_forward --whisper "$WSHAPE" --rows "${ROWS:-1,2,4,8,16}" \
  --forwards "${FORWARDS:-30}" --rounds "${ROUNDS:-2}" --out "$OUT/forward.json" > "$OUT/forward.log" 2>&1
tail -40 "$OUT/forward.log"
fi
[ -z "${SKIP_LIVE:-}" ] || exit 0
IFS=';' read -ra variants <<< "${VARIANTS:-default|;uncompiled|TANDEM_WHISPER_COMPILE=off}"
for v in "${variants[@]}"; do
  name=${v%%|*}; envs=${v#*|}
  step "live: $name ($envs)"
  env $envs OUT="$OUT/$name" SPEAKERS="${SPEAKERS:-16}" ITL_SESSIONS="${ITL_SESSIONS:-0}" AUDIO_S="${AUDIO_S:-15}" \
    BUDGET_S="${LIVE_S:-200}" timeout $((${LIVE_S:-200} + 20)) bash bench/gpu/live_h200.sh 2>&1 | grep -E "speakers|scheduler|chat ITL|FAILED|done:" | cut -c1-1500
done
step "done"
