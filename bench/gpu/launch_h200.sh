#!/bin/bash
# Mixed-iteration launch cost on the GPU host (bench/mixed_launch.py): new offsets each trial, then the same
# offset again, then a native py-spy profile of the MLX-attention trials (where MLX's launch spends the host).
# Needs the shape dir (built here when missing) and, for the profile, the py-spy wheel in _spy/ (carry it).
#   OUT=$OUT bash bench/gpu/launch_h200.sh
set -u
OUT=${OUT:-/tmp/launch-out}
mkdir -p "$OUT"
SHAPE=${SHAPE:-$HOME/shape}
[ -d "$SHAPE/rope" ] || timeout 150 python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out "$SHAPE" > "$OUT/shape.log" 2>&1
timeout ${NEW_S:-150} python3 -m bench.mixed_launch "$SHAPE/rope" ${ARGS:-} > "$OUT/mixed-new.log" 2>&1
tail -1 "$OUT/mixed-new.log" | cut -c1-600
timeout ${SAME_S:-90} python3 -m bench.mixed_launch "$SHAPE/rope" --same --modes mlx,kernel ${ARGS:-} > "$OUT/mixed-same.log" 2>&1
tail -1 "$OUT/mixed-same.log" | cut -c1-600
if ls _spy/py_spy-*.whl >/dev/null 2>&1 && [ "${SPY_S:-90}" != 0 ]; then
  python3 -c "import zipfile,glob; zipfile.ZipFile(glob.glob('_spy/py_spy-*.whl')[0]).extractall('/tmp/spy')"
  SPY=$(find /tmp/spy -name py-spy -type f | head -1) && chmod +x "$SPY"
  timeout ${SPY_S:-90} "$SPY" record --native -r 200 -f raw -o "$OUT/mixed-native.raw" -- \
    python3 -m bench.mixed_launch "$SHAPE/rope" --modes mlx --trials 25 > "$OUT/spy.log" 2>&1
  tail -2 "$OUT/spy.log"
fi
