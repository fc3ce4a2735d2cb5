#!/usr/bin/env bash
# Whisper decoding, this tree against an older one, on the lent H200 in ONE device call after install-c.sh:
#   bash .gpu/c/install-c.sh && export PYTHONPATH=$HOME/mlx-site:$PWD TANDEM_BLAS=reference PYTHONUNBUFFERED=1 \
#     && OLD_TREE=_old bash bench/gpu/speech_ab_h200.sh
# OLD_TREE: an untracked copy of the older tree (`git archive REV | tar -x -C _old`), which travels with this one.
# Carry .gpu/c and .gpu/tok (and .gpu/ptx: MLX's kernels saved on an earlier host, restored first).
#   FORWARD=1 (default): bench/decode_forward.py, compiled batches of ROWS rows, the two trees in turn (ROUNDS)
#   SERVERS="new;old;..." : one `tandem serve` per entry (chat and the turbo shape), each with the speaker rounds
#     SPEAKERS (default 16,16) over AUDIO_S s of audio (bench/live_serve.py); its own LIVE_S budget
#   PTX_SAVE=1: MLX's compiled kernels into $OUT for the next fresh host (bench/gpu/ptx_cache.sh)
# Writes $OUT/forward-<tree>.json, $OUT/<n>-<tree>/live.json and steps.log.
set -uo pipefail
OUT=${OUT:-/tmp/speech-ab}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/steps.log") 2>&1
source bench/gpu/shapes.sh
[ -f .gpu/ptx/mlx-ptx.tgz ] && bash bench/gpu/ptx_cache.sh restore .gpu/ptx
build_shapes || exit 1
NEW=$PWD
OLD=$(cd "${OLD_TREE:-_old}" 2>/dev/null && pwd) || { step "FAILED: no OLD_TREE"; exit 1; }
tree() { [ "$1" = old ] && echo "$OLD" || echo "$NEW"; }
if [ "${FORWARD:-1}" = 1 ]; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for t in new old; do
      step "forward $t (round $r)"
      (cd "$(tree $t)" && PYTHONPATH=$HOME/mlx-site:$(tree $t) timeout "${FORWARD_S:-90}" python3 -m bench.decode_forward \
        --whisper "$WSHAPE" --rows "${ROWS:-4,8,16}" --modes compiled --forwards "${FORWARDS:-30}" --rounds 1 \
        --out "$OUT/forward-$t.json" 2>&1 | tail -4)
    done
  done
fi
IFS=';' read -ra servers <<< "${SERVERS:-}"
n=0
for t in "${servers[@]}"; do
  n=$((n + 1))
  step "server $n: $t tree, speakers ${SPEAKERS:-16,16}"
  (cd "$(tree $t)" && PYTHONPATH=$HOME/mlx-site:$(tree $t) OUT="$OUT/$n-$t" SHAPE=$SHAPE WSHAPE=$WSHAPE \
    TOK_DIR=$NEW/.gpu/tok SPEAKERS="${SPEAKERS:-16,16}" ITL_SESSIONS=0 AUDIO_S="${AUDIO_S:-15}" \
    BUDGET_S="${LIVE_S:-170}" timeout $((${LIVE_S:-170} + 15)) bash bench/gpu/live_h200.sh 2>&1 \
    | grep -E "^speakers|scheduler|FAILED|done:" | cut -c1-700)
done
[ -z "${PTX_SAVE:-}" ] || bash bench/gpu/ptx_cache.sh save "$OUT"
step "done"
