#!/usr/bin/env bash
# TANDEM_FUSED_GEMV=on against off on the H200 in ONE device call (after install-c.sh): the kernels alone against
# MLX's gemv (bench/fused_gemv.py --per-kernel), then this tree's server over HTTP with and without them,
# alternating ROUNDS times after one warm-up server that compiles their kernels (a fresh host's first server was
# not ready within 55 s in the twenty-ninth session). Results: $OUT/per_kernel.jsonl, $OUT/{on,off}N.json. The
# defaults fit one 600 s call: ~120 s of kernels, ≤ 200 s of warm-up server, then ~90 s a server.
#   ROUNDS=1 SCENARIOS=c1 VAR_S=70 OUT=$OUT timeout 580 bash bench/gpu/fused_h200.sh
set -uo pipefail
OUT=${OUT:-/tmp/fused-out}
mkdir -p "$OUT"
timeout "${KERNEL_S:-120}" python3 -m bench.fused_gemv --per-kernel --rows "${ROWS:-1,4}" > "$OUT/per_kernel.jsonl" 2>&1
SCEN=${SCENARIOS:-c1}
# The warm-up server gets its own, longer budget: readiness counts against a server's budget.
SKIP_NEW=1 SKIP_PEER=1 READY_S=${READY_S:-180} VAR_S=${WARM_S:-180} VARIANTS="warm||c1|TANDEM_FUSED_GEMV=on" \
  OUT=$OUT bash bench/gpu/ab_h200.sh
VARS=""
for r in $(seq "${ROUNDS:-1}"); do
  VARS="$VARS;on$r||$SCEN|TANDEM_FUSED_GEMV=on;off$r||$SCEN|TANDEM_FUSED_GEMV=off"
done
SKIP_NEW=1 SKIP_PEER=1 READY_S=${READY_S:-180} VAR_S=${VAR_S:-70} VARIANTS="${VARS#;}" OUT=$OUT bash bench/gpu/ab_h200.sh
