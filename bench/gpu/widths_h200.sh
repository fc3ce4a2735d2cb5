#!/usr/bin/env bash
# Whether the fused matrix-vector kernels (engine/fused_gemv.py, on by default only up to AUTO_MAX_HIDDEN = 2,048)
# also win at a wider model: ONE device call a width, right after install-c.sh (each fits 600 s):
#   WIDTH=3b OUT=$OUT timeout 580 bash bench/gpu/widths_h200.sh     then     WIDTH=8b SKIP_TESTS=1 ...
# 1. unless SKIP_TESTS=1: tests/engine/test_fused_gemv.py on the device (its CUDA-only tests) → $OUT/tests.log
# 2. the kernels alone against MLX's products at that width (bench/fused_gemv.py) → $OUT/kernels.jsonl
# 3. a random-init checkpoint of that shape (bench/gpu/build_shape.py --shape) in $HOME/shape-$WIDTH
# 4. this tree's server over HTTP: a warm-up server (kernels compile), then TANDEM_FUSED_GEMV=on / off alternating
#    ROUNDS times on SCENARIOS (default c1,c8) → $OUT/{warm,onN,offN}.json. BUILD_ARGS=--tiny: the scripts on a CPU
set -uo pipefail
OUT=${OUT:-/tmp/widths-out}
WIDTH=${WIDTH:-3b}
mkdir -p "$OUT"
SECONDS=0
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }
if [ -z "${SKIP_TESTS:-}" ]; then
  step "tests"
  timeout "${TESTS_S:-100}" python3 -m pytest -q -p no:cacheprovider -rs tests/engine/test_fused_gemv.py \
    > "$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
fi
case "$WIDTH" in
  3b) DIMS="--hidden 3072 --intermediate 8192 --qkv 5120 --layers 28" ;;
  8b) DIMS="--hidden 4096 --intermediate 14336 --qkv 6144 --layers 32" ;;
  *) DIMS="" ;;
esac
step "kernels at $WIDTH"
timeout "${KERNEL_S:-60}" python3 -m bench.fused_gemv $DIMS --rows 1,4 --vocab 49152 > "$OUT/kernels.jsonl" 2>&1
tail -2 "$OUT/kernels.jsonl"
MODEL=$HOME/shape-$WIDTH/rope
step "build $WIDTH"
[ -d "$MODEL" ] || timeout "${BUILD_S:-150}" python3 -m bench.gpu.build_shape --tokenizer .gpu/tok \
  --out "$HOME/shape-$WIDTH" --shape "$WIDTH" ${BUILD_ARGS:-} | tail -1
[ -d "$MODEL" ] || { echo "FAILED: no $MODEL"; exit 1; }
SCEN=${SCENARIOS:-c1,c8}
# The warm-up server gets its own, longer budget: readiness counts against a server's budget.
MODEL=$MODEL SKIP_NEW=1 SKIP_PEER=1 READY_S=${READY_S:-180} VAR_S=${WARM_S:-120} \
  VARIANTS="warm||c1|TANDEM_FUSED_GEMV=on" OUT=$OUT bash bench/gpu/ab_h200.sh
VARS=""
for r in $(seq "${ROUNDS:-1}"); do
  VARS="$VARS;on$r||$SCEN|TANDEM_FUSED_GEMV=on;off$r||$SCEN|TANDEM_FUSED_GEMV=off"
done
MODEL=$MODEL SKIP_NEW=1 SKIP_PEER=1 READY_S=${READY_S:-180} VAR_S=${VAR_S:-90} VARIANTS="${VARS#;}" OUT=$OUT \
  bash bench/gpu/ab_h200.sh
step "done"
