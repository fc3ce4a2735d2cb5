#!/bin/bash
# On the GPU host: decode steps beside prompt chunks launched from a second thread (bench/prefill_thread.py), the
# host's cost of launching a mixed iteration against a decode-only one (bench/mixed_launch.py), then a native
# py-spy profile of the mixed launches (where MLX spends the host). Builds the shape dir when missing; the profile
# needs the py-spy wheel in _spy/ (carry it).   OUT=$OUT bash bench/gpu/launch_h200.sh
set -u
OUT=${OUT:-/tmp/launch-out}
mkdir -p "$OUT"
SHAPE=${SHAPE:-$HOME/shape}
[ -d "$SHAPE/rope" ] || timeout 150 python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out "$SHAPE" > "$OUT/shape.log" 2>&1
timeout ${THREAD_S:-120} python3 -m bench.prefill_thread "$SHAPE/rope" ${THREAD_ARGS:-} > "$OUT/thread.log" 2>&1
tail -1 "$OUT/thread.log" | cut -c1-1500
timeout ${LAUNCH_S:-120} python3 -m bench.mixed_launch "$SHAPE/rope" ${ARGS:-} > "$OUT/mixed.log" 2>&1
tail -1 "$OUT/mixed.log" | cut -c1-700
if ls _spy/py_spy-*.whl >/dev/null 2>&1 && [ "${SPY_S:-150}" != 0 ]; then
  python3 -c "import zipfile,glob; zipfile.ZipFile(glob.glob('_spy/py_spy-*.whl')[0]).extractall('/tmp/spy')"
  SPY=$(find /tmp/spy -name py-spy -type f | head -1) && chmod +x "$SPY"
  timeout ${SPY_S:-150} "$SPY" record --native -r ${SPY_RATE:-50} -f raw -o "$OUT/mixed-native.raw" -- \
    python3 -m bench.mixed_launch "$SHAPE/rope" --modes mixed --offsets 512 --trials 60 > "$OUT/spy.log" 2>&1
  tail -2 "$OUT/spy.log"
fi
