#!/usr/bin/env bash
# Live speech beside chat on the lent H200, in ONE device call, right after install-c.sh (../shared/gpu/README.md):
#   bash .gpu/c/install-c.sh && export PYTHONPATH=$HOME/mlx-site:$PWD TANDEM_BLAS=reference PYTHONUNBUFFERED=1 \
#     && bash bench/gpu/live_h200.sh
# Carry .gpu/c and .gpu/tok (the demo tokenizer: `uv run python -m bench.gpu.export_tokenizer .gpu/tok`). Steps,
# each under `timeout`, with timestamps; the whole script stays within BUDGET_S (default 290 s < 5 minutes):
#   1. build a random-init Llama-3.2-1B-shape chat model (bench/gpu/build_shape.py) and a random-init Whisper
#      large-v3-turbo-shape checkpoint (bench/speech_shape.py --build-only), both in /tmp
#   2. one `tandem serve` serving both (Whisper resident, preloaded), started and stopped by bench/live_serve.py
#   3. bench/live_serve.py over the wire: chat ITL alone vs with 4 live sessions streaming in real time, then
#      live sessions sustained in real time with 1/4/8/16 speakers (Realtime websocket sessions)
# Audio: the WAVs in $SAMPLES when set (e.g. the shared samples), else a synthetic voiced signal the VAD passes
# (a random-init Whisper transcribes noise either way: the figures are compute, not accuracy).
# Writes to $OUT: steps.log live.json live.server.log.
# Knobs (environment): BUDGET_S, ITL_SESSIONS (0: no chat round), SPY (py-spy's path: a profile, $OUT/spy.txt),
# SPY_AFTER_S, SPY_S, OURS_ARGS (extra `tandem serve` flags), SPEAKERS (default 1,4,8,16), AUDIO_S
# (seconds of audio per speaker, default 20), TOKENS (chat tokens per answer, default 128), ROUNDS (chat answers
# timed alone and beside the sessions, default 2), WHISPER_SHAPE
# (large-v3-turbo | tiny), WHISPER_DTYPE (default float16), TOK_DIR, BUILD_ARGS (--tiny: toy chat model, to check
# this script on a CPU: WHISPER_SHAPE=tiny WHISPER_DTYPE=float32 BUILD_ARGS=--tiny SPEAKERS=1 AUDIO_S=8).
set -uo pipefail
OUT=${OUT:-/tmp/bench-out}
BUDGET_S=${BUDGET_S:-290}
OURS_ARGS=${OURS_ARGS:---max-active 64}
SPEAKERS=${SPEAKERS-1,4,8,16}  # empty: no speaker rounds
AUDIO_S=${AUDIO_S:-20}
TOKENS=${TOKENS:-128}
PORT=${PORT:-8093}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/steps.log") 2>&1
source bench/gpu/shapes.sh
left() { echo $((BUDGET_S - SECONDS)); }

step "host: $(nproc) CPUs; OURS_ARGS='$OURS_ARGS' SPEAKERS=$SPEAKERS AUDIO_S=$AUDIO_S WHISPER=$WHISPER_SHAPE/$WHISPER_DTYPE"
timeout 20 nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader || true
timeout 90 python3 -c "import mlx.core as mx, websockets; print('mlx', mx.__version__, mx.default_device(),
  '| websockets', websockets.__version__)" || { step "FAILED: mlx or websockets does not import"; exit 1; }

step "1. build the chat shape ($SHAPE/plain) and the Whisper shape ($WSHAPE)"
build_shapes || exit 1

L=$(left)
step "2+3. serve both, measure (${L}s left)"
timeout -k 20 $((L - 10)) python3 -m bench.live_serve --server "http://127.0.0.1:$PORT" \
  --serve "$SHAPE/plain --whisper-model $WSHAPE --whisper-resident --preload --max-sessions 40 $OURS_ARGS" \
  --ready-timeout 150 --itl-sessions "${ITL_SESSIONS:-4}" --tokens "$TOKENS" --rounds "${ROUNDS:-2}" \
  --speakers "$SPEAKERS" --seconds "$AUDIO_S" ${SAMPLES:+--samples "$SAMPLES"} --out "$OUT/live.json" > /dev/null &
LOAD=$!
if [ -n "${SPY:-}" ]; then  # SPY=path/to/py-spy: every thread of the server, SPY_S s from SPY_AFTER_S s after ready
  for _ in $(seq 1 600); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null && break; sleep 0.5; done
  sleep "${SPY_AFTER_S:-5}"
  pid=$(pgrep -f "service.cli serve" | head -1)
  step "py-spy on $pid"
  timeout $((${SPY_S:-15} + 10)) "$SPY" record --pid "$pid" --subprocesses --threads --rate 200 --duration "${SPY_S:-15}" \
    --format raw --output "$OUT/spy.txt" --nonblocking > "$OUT/spy.log" 2>&1 || { step "py-spy failed:"; tail -3 "$OUT/spy.log"; }
fi
wait $LOAD
rc=$?
python3 -c "
import json; d = json.load(open('$OUT/live.json'))
c = d.get('chat_itl') or {}
s = c.get('scheduler') or {}
print('chat ITL alone', c.get('itl_alone_ms'), '| with', c.get('sessions'), 'sessions', c.get('itl_with_sessions_ms'),
      '| ratio p50', c.get('p50_ratio'), 'p99', c.get('p99_ratio'), '| session errors', c.get('session_errors'),
      '| Whisper windows done by then', s.get('windows_done'), '(encoder/decoder steps', s.get('encoder_steps'),
      '/', s.get('decoder_steps'), ')')
for r in d.get('speakers', []):
    print('speakers', r['speakers'], '| sustained', r['sustained'], '| finish after', r['finish_after_last_chunk_s_max'],
          's | max lag', r['max_lag_s'], 's | first word', r['first_word_after_onset_s'], '| final', r['final_after_speech_end_s'],
          '| errors', r['errors'][:2])
    print('  scheduler', json.dumps(r.get('scheduler')))
" || echo "no live.json (rc $rc)"
step "done: rc=$rc (files in \$OUT: $(ls "$OUT" | tr '\n' ' '))"
