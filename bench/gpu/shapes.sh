# Sourced by the bench/gpu scripts that serve chat and speech on the lent H200: the step log and the two
# random-init models they serve, built on the host (nothing can be downloaded there).
#   SHAPE (default /tmp/shape): the chat shape's dir (plain/ and rope/, bench/gpu/build_shape.py)
#   WSHAPE (default /tmp/whisper-shape), WHISPER_SHAPE (large-v3-turbo | tiny), WHISPER_DTYPE (float16)
#   TOK_DIR (default .gpu/tok), BUILD_ARGS (--tiny: a toy chat shape, to try a script on a CPU)
SHAPE=${SHAPE:-/tmp/shape}
WSHAPE=${WSHAPE:-/tmp/whisper-shape}
WHISPER_SHAPE=${WHISPER_SHAPE:-large-v3-turbo}
WHISPER_DTYPE=${WHISPER_DTYPE:-float16}
TOK_DIR=${TOK_DIR:-.gpu/tok}
SECONDS=0
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }

build_shapes() {  # both models, each unless built already with the same settings; 1 (a FAILED line) if one fails
  local chat="${BUILD_ARGS:-full}" speech="$WHISPER_SHAPE/$WHISPER_DTYPE"
  if [ "$(cat "$SHAPE/.built" 2>/dev/null)" != "$chat" ]; then
    rm -rf "$SHAPE"
    timeout 120 python3 -m bench.gpu.build_shape --tokenizer "$TOK_DIR" --out "$SHAPE" ${BUILD_ARGS:-} | tail -1
    [ -f "$SHAPE/plain/config.json" ] || { step "FAILED: chat model build"; return 1; }
    echo "$chat" > "$SHAPE/.built"
  fi
  if [ "$(cat "$WSHAPE/.built" 2>/dev/null)" != "$speech" ]; then
    rm -rf "$WSHAPE"
    timeout 90 python3 -m bench.speech_shape --build-only "$WSHAPE" --shape "$WHISPER_SHAPE" --dtype "$WHISPER_DTYPE" \
      || { step "FAILED: Whisper build"; return 1; }
    echo "$speech" > "$WSHAPE/.built"
  fi
}
