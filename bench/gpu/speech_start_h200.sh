#!/usr/bin/env bash
# A chat + speech server as a user starts it on the H200 (no --preload, no --whisper-resident): its start-up
# lines (chat warm-up, speech warm-up, ready), then one transcription and one chat at once, then SIGTERM.
# After install-c.sh, with .gpu/tok and WAV (a speech file) carried:
#   WAV=.gpu/wav/cards-001.wav OUT=$OUT/start bash bench/gpu/speech_start_h200.sh
set -uo pipefail
OUT=${OUT:-/tmp/start-out}
PORT=${PORT:-8094}
mkdir -p "$OUT"
source bench/gpu/shapes.sh
build_shapes || exit 1
step "serve $SHAPE/plain --whisper-model $WSHAPE"
python3 -m service.cli serve "$SHAPE/plain" --whisper-model "$WSHAPE" --port "$PORT" ${SERVE_ARGS:-} > "$OUT/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 900); do
  curl -sf -o /dev/null "http://127.0.0.1:$PORT/health" && break
  kill -0 $SERVER 2>/dev/null || break
  sleep 0.2
done
step "ready (or gone)"; grep -E "warm-up|ready|Error|error" "$OUT/server.log" | head
curl -s -o "$OUT/transcription.json" -w "transcription: HTTP %{http_code} in %{time_total} s\n" \
  -F "file=@$WAV" -F model=whisper-1 -F temperature=0 "http://127.0.0.1:$PORT/v1/audio/transcriptions" &
A=$!
curl -s -o "$OUT/chat.json" -w "chat: HTTP %{http_code} in %{time_total} s\n" -H "Content-Type: application/json" \
  -d '{"messages":[{"role":"user","content":"Say something."}],"max_tokens":32}' "http://127.0.0.1:$PORT/v1/chat/completions" &
B=$!
wait $A $B
head -c 300 "$OUT/chat.json"; echo; head -c 200 "$OUT/transcription.json"; echo
curl -s "http://127.0.0.1:$PORT/stats" | python3 -c "
import json, sys; d = json.load(sys.stdin); s = d.get('speech') or {}
print('speech loads', s.get('loads'), 'unloads', s.get('unloads'), 'loaded', s.get('loaded'), '| windows', (s.get('scheduler') or {}).get('windows_done'))"
kill -TERM $SERVER; t0=$SECONDS; wait $SERVER; step "stopped (rc $?) in $((SECONDS - t0)) s"
