#!/usr/bin/env bash
# (.gpu/c needs the prometheus-client and websockets wheels too: prepare.sh --server prometheus-client websockets)
# Everything the closing notes need from the H200, in ONE device call after install-c.sh (each step under
# `timeout`, results in $OUT): the chat shape with Llama 3.2's rope_scaling; ours (default), ours with
# --isolate and mlx_lm.server on the same scenarios; then bench/gpu/live_h200.sh when present (speech).
#   bash .gpu/c/install-c.sh && export PYTHONPATH=$HOME/mlx-site:$PWD TANDEM_BLAS=reference PYTHONUNBUFFERED=1 \
#     && bash bench/gpu/final_h200.sh
set -uo pipefail
OUT=${OUT:-/tmp/final-out}
mkdir -p "$OUT"
SECONDS=0
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }
ARGS="--max-active 128 --no-whisper"
COMMON=(--model "$HOME/shape/rope" --profile quick --timeout 60 --ready-timeout 90 --log-dir "$OUT")
step "build"
[ -d "$HOME/shape/rope" ] || timeout 90 python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out "$HOME/shape" ${BUILD_ARGS:-} | tail -1
# Knobs: OURS_SCENARIOS, PEER_SCENARIOS, SKIP_ISOLATE=1, SKIP_LIVE=1 (speech in its own call), OURS_S and
# PEER_S (seconds per server, start included; default 110 and 100).
OURS_S=${OURS_S:-110}
PEER_S=${PEER_S:-100}
step "ours (default)"
timeout $((OURS_S + 20)) python3 -m bench.serve --only ours "${COMMON[@]}" --scenarios "${OURS_SCENARIOS:-c1,c64,poisson8,c128}" \
  --ours-args "$ARGS" --server-budget "$OURS_S" --out "$OUT/ours.json" 2>&1 | grep -E "tandem (c|p|:)" | grep -v starting
if [ -z "${SKIP_ISOLATE:-}" ]; then
  step "ours --isolate"
  timeout 100 python3 -m bench.serve --only ours "${COMMON[@]}" --scenarios c64,poisson8 --ours-args "$ARGS --isolate" \
    --server-budget 80 --out "$OUT/isolate.json" 2>&1 | grep -E "tandem (c|p|:)" | grep -v starting
fi
step "peer"
timeout $((PEER_S + 20)) python3 -m bench.serve --only peer "${COMMON[@]}" --scenarios "${PEER_SCENARIOS:-c1,c64,poisson8}" \
  --server-budget "$PEER_S" --out "$OUT/peer.json" 2>&1 | grep -E "peer (c|p|:)" | grep -v starting
if [ -f bench/gpu/live_h200.sh ] && [ -z "${SKIP_LIVE:-}" ]; then  # SKIP_LIVE=1: speech in its own call
  step "speech (bench/gpu/live_h200.sh)"
  OUT="$OUT" BUDGET_S=140 timeout 150 bash bench/gpu/live_h200.sh 2>&1 | tail -25
fi
step "done"
