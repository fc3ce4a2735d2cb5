#!/usr/bin/env bash
# Serving benchmark on the lent H200 in ONE device call, right after install-c.sh (../shared/gpu/README.md):
#   bash .gpu/c/install-c.sh && export PYTHONPATH=$HOME/mlx-site:$PWD TANDEM_BLAS=reference PYTHONUNBUFFERED=1 \
#     && bash bench/gpu/serve_h200.sh
# Carry .gpu/c and .gpu/tok (the demo tokenizer: `uv run python -m bench.gpu.export_tokenizer .gpu/tok`, run
# after prepare.sh, which empties .gpu/). Steps, each under `timeout`, with timestamps:
#   1. build a random-init Llama-3.2-1B-shape bf16 model twice (plain, and with Llama 3.2's rope_scaling)
#   2. smoke: one streamed + one plain request to ours on the rope_scaling variant (must return text)
#   3. the scenarios (bench/serve.py, profile quick) against ours, then mlx_lm.server, same model dir
# Writes 7 files to $OUT: steps.log smoke.json smoke.log serve.json serve.md tandem.log peer.log.
# Knobs (environment): BUDGET_S (seconds for this script; default 500 = the call's 600 less install-c and
# margin), OURS_ARGS, PEER_ARGS, PROFILE, SCENARIOS, MODEL_VARIANT (plain|rope: what step 3 serves), TOK_DIR,
# BUILD_ARGS (--tiny: a toy model, to check this script on a CPU: see bench/RESULTS.md).
set -uo pipefail
OUT=${OUT:-/tmp/bench-out}
BUDGET_S=${BUDGET_S:-500}
OURS_ARGS=${OURS_ARGS:---max-active 128 --no-whisper}
PEER_ARGS=${PEER_ARGS:-}
PROFILE=${PROFILE:-quick}
SCENARIOS=${SCENARIOS:-c1,c8,c64,poisson8,c128}
MODEL_VARIANT=${MODEL_VARIANT:-plain}
TOK_DIR=${TOK_DIR:-.gpu/tok}
SHAPE=/tmp/shape
mkdir -p "$OUT"
exec > >(tee -a "$OUT/steps.log") 2>&1
SECONDS=0
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }
left() { echo $((BUDGET_S - SECONDS)); }

step "host: $(nproc) CPUs; OURS_ARGS='$OURS_ARGS' PEER_ARGS='$PEER_ARGS' PROFILE=$PROFILE SCENARIOS=$SCENARIOS"
timeout 20 nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader || true
timeout 90 python3 -c "import importlib.metadata as m, mlx.core as mx; print('mlx', mx.__version__, mx.default_device(),
  '| mlx-lm', m.version('mlx-lm'), '| transformers', m.version('transformers'), '| httpx', m.version('httpx'))" \
  || { step "FAILED: mlx does not import (PYTHONPATH=$PYTHONPATH)"; exit 1; }

step "1. build models ($SHAPE/plain, $SHAPE/rope) from $TOK_DIR"
timeout 150 python3 -m bench.gpu.build_shape --tokenizer "$TOK_DIR" --out "$SHAPE" ${BUILD_ARGS:-} \
  || { step "FAILED: model build"; exit 1; }

step "2. smoke: ours on the rope_scaling variant"
timeout -k 20 150 python3 -m bench.serve --smoke --model "$SHAPE/rope" --ours-args "$OURS_ARGS" --timeout 60 \
  --ready-timeout 110 --log-dir "$OUT" --out "$OUT/smoke.json" > /dev/null
rc=$?
python3 -c "
import json; d = json.load(open('$OUT/smoke.json'))
s, p = d.get('streamed') or {}, d.get('plain') or {}
print('smoke', 'OK' if d['ok'] else 'FAILED', '| ready', d.get('ready_s'), 's | streamed', s.get('status'), s.get('error'),
      repr(s.get('text', ''))[:60], '| plain', p.get('status'), repr(p.get('text', ''))[:60], '|', d.get('error') or '')
" || echo "smoke: no smoke.json (rc $rc)"
step "smoke rc=$rc"

L=$(left)
PER=$(((L - 70) / 2))
step "3. scenarios on $SHAPE/$MODEL_VARIANT: ours then peer, ${PER}s budget each, ${L}s left"
timeout -k 20 $((L - 25)) python3 -m bench.serve --model "$SHAPE/$MODEL_VARIANT" --profile "$PROFILE" \
  --scenarios "$SCENARIOS" --ours-args "$OURS_ARGS" --peer-args "$PEER_ARGS" --server-budget "$PER" --timeout 60 \
  --ready-timeout 150 --out "$OUT/serve.json" --markdown "$OUT/serve.md" --log-dir "$OUT" --ratios
step "done: rc=$? (files in \$OUT: $(ls "$OUT" | tr '\n' ' '))"
