#!/usr/bin/env bash
# Compiled decode steps (engine/compiled_decode.py) on the lent H200, in ONE device call right after install-c.sh:
#   bash .gpu/c/install-c.sh && export PYTHONPATH=$HOME/mlx-site:$PWD TANDEM_BLAS=reference PYTHONUNBUFFERED=1 \
#     && bash bench/gpu/compile_h200.sh
# 1. unless SKIP_PROFILE=1: bench/step_profile.py on the chat shape, compiled off then on (PROFILE_ORDER; ROWS,
#    default 1,8,32,64)
# 2. unless SKIP_TESTS=1: the slot, pipeline and compiled-decode tests on the device (compiled by default there)
# 3. bench/gpu/ab_h200.sh once per ORDER entry (default "off on"; "peer" runs mlx_lm.server): SCENARIOS
# Writes $OUT/profile_<n>_{off,on}.json, $OUT/tests.log, $OUT/{off,on,peer}/*.json.
set -uo pipefail
OUT=${OUT:-/tmp/compile-out}
mkdir -p "$OUT"
SECONDS=0
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }
MODEL=$HOME/shape/rope
[ -d "$MODEL" ] || timeout 90 python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out "$HOME/shape" | tail -1
if [ -z "${SKIP_PROFILE:-}" ]; then
  i=0
  for mode in ${PROFILE_ORDER:-off on}; do
    i=$((i + 1))
    step "step profile, compiled $mode"
    TANDEM_DECODE_COMPILE=$mode timeout ${PROFILE_S:-90} python3 -m bench.step_profile "$MODEL" --rows "${ROWS:-1,8,32,64}" \
      --steps "${STEPS:-40}" --out "$OUT/profile_${i}_$mode.json" 2>&1 | grep -E "^(decode|mixed|prefill)|Error"
  done
fi
if [ -z "${SKIP_TESTS:-}" ]; then
  step "tests"
  timeout ${TESTS_S:-120} python3 -m pytest -q -p no:cacheprovider tests/engine/test_compiled_decode.py \
    tests/engine/test_slots.py tests/engine/test_decode_attention.py tests/engine/test_pipeline.py \
    tests/engine/test_fused_gemv.py > "$OUT/tests.log" 2>&1
  tail -5 "$OUT/tests.log"
fi
for mode in ${ORDER:-off on}; do
  if [ "$mode" = peer ]; then
    step "peer"
    SKIP_NEW=1 OUT="$OUT/peer" SCENARIOS="${SCENARIOS:-c1,c8,poisson8,c64}" PEER_S="${AB_S:-150}" \
      timeout $((${AB_S:-150} + 40)) bash bench/gpu/ab_h200.sh 2>&1 | grep -v "^\[.*build"
    continue
  fi
  step "tandem serve, compiled $mode"
  TANDEM_DECODE_COMPILE=$mode SKIP_PEER=1 OUT="$OUT/$mode" SCENARIOS="${SCENARIOS:-c1,c8,poisson8,c64}" \
    NEW_S="${AB_S:-150}" timeout $((${AB_S:-150} + 40)) bash bench/gpu/ab_h200.sh 2>&1 | grep -v "^\[.*build"
done
step "done"
