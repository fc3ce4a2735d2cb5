#!/usr/bin/env bash
# MLX's CUDA graph limits on the lent H200, in ONE device call right after install-c.sh: MLX cuts each evaluation
# into CUDA graphs of at most MLX_MAX_OPS_PER_BUFFER kernels / MLX_MAX_MB_PER_BUFFER MB (100 / 1,000 on an H100 or
# H200); a 1B decode step is ~300 kernels. bench/step_profile.py once per LIMITS entry ("ops:mb"; "default" leaves
# MLX's own), compiled decode steps as served on CUDA.
#   bash .gpu/c/install-c.sh && export PYTHONPATH=$HOME/mlx-site:$PWD TANDEM_BLAS=reference PYTHONUNBUFFERED=1 \
#     && OUT=$OUT bash bench/gpu/graph_limits_h200.sh
# Writes $OUT/graph_<entry>.json.
set -uo pipefail
OUT=${OUT:-/tmp/graph-out}
mkdir -p "$OUT"
SECONDS=0
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }
MODEL=$HOME/shape/rope
[ -d "$MODEL" ] || timeout 90 python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out "$HOME/shape" | tail -1
for entry in ${LIMITS:-default 400:10000 1000:100000}; do
  step "step profile, graph limits $entry"
  if [ "$entry" = default ]; then
    env -u MLX_MAX_OPS_PER_BUFFER -u MLX_MAX_MB_PER_BUFFER timeout ${PROFILE_S:-60} python3 -m bench.step_profile \
      "$MODEL" --rows "${ROWS:-1,8,64}" --steps "${STEPS:-40}" --out "$OUT/graph_default.json" 2>&1 | grep -E "^(decode|mixed|prefill)|Error"
  else
    MLX_MAX_OPS_PER_BUFFER=${entry%%:*} MLX_MAX_MB_PER_BUFFER=${entry##*:} timeout ${PROFILE_S:-60} python3 -m bench.step_profile \
      "$MODEL" --rows "${ROWS:-1,8,64}" --steps "${STEPS:-40}" --out "$OUT/graph_${entry%%:*}.json" 2>&1 | grep -E "^(decode|mixed|prefill)|Error"
  fi
done
step "done"
