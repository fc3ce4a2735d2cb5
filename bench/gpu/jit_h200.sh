#!/usr/bin/env bash
# Which kernel modules MLX compiles while serving (after `ready`), in ONE device call right after install-c.sh:
#   bash .gpu/c/install-c.sh && export PYTHONPATH=$HOME/mlx-site:$PWD TANDEM_BLAS=reference PYTHONUNBUFFERED=1 \
#     && OLD_TREE=_old bash bench/gpu/jit_h200.sh
# Every server gets a fresh MLX_PTX_CACHE_DIR (as on a host's first start) watched by bench/gpu/jit_watch.py, so
# $OUT/<run>.modules.log lists each module with the time it landed and the time /health said ready.
#   live-old / live-new: chat beside 4 live sessions (bench/live_serve.py, no speaker rounds), OLD_TREE's server
#     then this tree's (its speech warm-up); serve: this tree's chat server under SCENARIOS (bench/serve.py).
# Knobs: SPEAKERS (speaker rounds in the live runs, e.g. 10; default none), ITL_SESSIONS (default 4; 0: no chat),
# AUDIO_S, LIVE_S, SKIP_SERVE=1 (the live runs only).
# Carry .gpu/c, .gpu/tok and OLD_TREE (an untracked copy: `git archive REV | tar -x -C _old`).
set -uo pipefail
OUT=${OUT:-/tmp/jit-out}
SCEN=${SCENARIOS:-c1,c8,poisson8,c64}
ROUNDS=${ROUNDS:-4}
PORT=${PORT:-8093}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/steps.log") 2>&1
source bench/gpu/shapes.sh

watch() {  # $1 run name, $2 port (0: none): a fresh PTX cache and its watcher, which stamps /health's first 200
  local dir=/tmp/ptx-$1
  rm -rf "$dir"; mkdir -p "$dir"
  export MLX_PTX_CACHE_DIR=$dir
  local ready=(); [ "$2" = 0 ] || ready=(--ready "http://127.0.0.1:$2/health")
  python3 -m bench.gpu.jit_watch "$dir" "${ready[@]}" > "$OUT/$1.modules.log" 2>&1 &
  WATCHER=$!
}
unwatch() { kill "$WATCHER" 2>/dev/null; wait "$WATCHER" 2>/dev/null; unset MLX_PTX_CACHE_DIR; }

step "build the chat shape and the Whisper shape"
build_shapes || exit 1

live() {  # $1 run name, $2 tree
  step "live $1 ($2)"
  watch "$1" "$PORT"
  (cd "$2" && PYTHONPATH=$HOME/mlx-site:$PWD timeout -k 10 ${LIVE_S:-170} python3 -m bench.live_serve \
    --server "http://127.0.0.1:$PORT" --ready-timeout 150 \
    --serve "$SHAPE/plain --whisper-model $WSHAPE --whisper-resident --preload --max-sessions 40 --max-active 64" \
    --itl-sessions "${ITL_SESSIONS:-4}" --tokens 128 --rounds "$ROUNDS" --speakers "${SPEAKERS:-}" --seconds "${AUDIO_S:-10}" \
    --out "$OUT/$1.json" > /dev/null)
  unwatch
  python3 -c "
import json; d = json.load(open('$OUT/$1.json')); c = d.get('chat_itl') or {}; s = c.get('scheduler') or {}
t = ((s.get('chat_iteration_times') or {}).get('decode') or {})
print('$1: chat ITL alone', c.get('itl_alone_ms'), '| beside', c.get('itl_with_sessions_ms'), '| p99 ratio', c.get('p99_ratio'),
      '| chat decode max', t.get('max_ms'), '| windows', s.get('windows_done'))
for r in d.get('speakers', []):
    steps = (r.get('scheduler') or {}).get('recent_steps') or {}
    print('$1: speakers', r['speakers'], '| finish after', r['finish_after_last_chunk_s_max'], 's | Whisper steps max ms',
          {k: v.get('max_ms') for k, v in steps.items()})" || echo "$1: no result"
  echo "$1: modules after READY:"; awk '/READY/{r=1; next} r' "$OUT/$1.modules.log" | head -40
}
[ -n "${OLD_TREE:-}" ] && [ -d "$OLD_TREE" ] && { cp bench/live_serve.py "$OLD_TREE/bench/"; live live-old "$OLD_TREE"; }
live live-new .

[ -z "${SKIP_SERVE:-}" ] || { step "done"; exit 0; }
step "serve ($SCEN)"
watch serve 0  # bench/serve.py picks its own port: no ready stamp (its own warm-up round comes first)
timeout -k 10 ${SERVE_S:-200} python3 -m bench.serve --only ours --model "$SHAPE/rope" --profile quick --timeout 60 \
  --ready-timeout 150 --log-dir "$OUT" --scenarios "$SCEN" --ours-args "--max-active 128 --no-whisper" \
  --server-budget $((${SERVE_S:-200} - 20)) --out "$OUT/serve.json" 2>&1 | grep -E "tandem (c|p|:)" | grep -v starting
unwatch
grep -n "warm-up done\|ready" "$OUT/tandem.log" | head -3
echo "serve: the last 30 modules:"; tail -30 "$OUT/serve.modules.log"
step "done"
