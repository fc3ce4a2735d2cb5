#!/usr/bin/env bash
# CUDA stream priorities (engine/stream_priority.py) on the lent H200, after install-c.sh, in one or more device calls
# chosen by PHASES (comma-separated, in this order):
#   verify  the library preloaded in front of the real MLX: counts of raised and plain streams, raised or not
#   prefill bench.prefill_thread (32 decode rows on the main thread beside 512-token chunks on a second thread),
#           the main thread's stream raised, then not, then raised (the same library loaded each time)
#   ab      `tandem serve` on poisson8 and c1 ($SCENARIOS), priorities on (the default), off, on
#   live    bench/gpu/live_h200.sh's chat ITL alone vs beside 4 live sessions, on, off, on (no speaker rounds)
#   OUT=$OUT PHASES=verify,prefill bash bench/gpu/priority_h200.sh
set -uo pipefail
OUT=${OUT:-/tmp/prio-out}
PHASES=${PHASES:-verify,prefill,ab,live}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/steps.log") 2>&1
SECONDS=0
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }
has() { [[ ",$PHASES," == *",$1,"* ]]; }
SHIM=$(timeout 90 python3 -c "from pathlib import Path; from engine.stream_priority import build; print(build(Path.home() / '.cache/mlx-tandem/native'))")
step "library: $SHIM"
[ -f "$SHIM" ] || { step "FAILED: no library built"; exit 1; }
[ -d "$HOME/shape/rope" ] || timeout 90 python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out "$HOME/shape" | tail -1
if has verify; then
  for r in 1 0; do
    LD_PRELOAD=$SHIM timeout 90 python3 -c "
import ctypes, threading
ctypes.CDLL(None).tandem_stream_priority_raise($r)
import mlx.core as mx
mx.eval(mx.ones(3) + 1)
t = threading.Thread(target=lambda: mx.eval(mx.ones(4) * 2)); t.start(); t.join()
from engine import stream_priority
print('main thread raised=$r:', stream_priority.counts(), stream_priority.describe())" 2>&1 | tail -3
  done
fi
if has prefill; then
  for r in 1 0 1; do
    step "prefill_thread, main thread raised=$r"
    LD_PRELOAD=$SHIM timeout ${PREFILL_S:-120} python3 -c "
import ctypes, sys
ctypes.CDLL(None).tandem_stream_priority_raise($r)
from bench.prefill_thread import main
sys.exit(main(['$HOME/shape/rope', '--rows', '32', '--steps', '${STEPS:-200}']))" 2>&1 | grep -E "^(alone|mixed|beside)" \
      | tee -a "$OUT/prefill-$r.txt"
  done
fi
if has ab; then
  for v in on off on2; do
    step "ab: priorities $v"
    if [ "$v" = off ]; then export TANDEM_STREAM_PRIORITY=off; else unset TANDEM_STREAM_PRIORITY; fi
    OUT="$OUT/ab-$v" SKIP_PEER=1 SCENARIOS=${SCENARIOS:-poisson8,c1} NEW_S=${AB_S:-110} timeout $((${AB_S:-110} + 60)) \
      bash bench/gpu/ab_h200.sh 2>&1 | grep -v "^\[" 
    grep -h "stream" "$OUT/ab-$v"/*.log 2>/dev/null | grep -i "cuda" | head -2
  done
  unset TANDEM_STREAM_PRIORITY
fi
if has live; then
  for v in on off on2; do
    step "live: priorities $v"
    if [ "$v" = off ]; then export TANDEM_STREAM_PRIORITY=off; else unset TANDEM_STREAM_PRIORITY; fi
    OUT="$OUT/live-$v" SPEAKERS="" ROUNDS=${ROUNDS:-6} AUDIO_S=10 BUDGET_S=${LIVE_S:-170} \
      timeout $((${LIVE_S:-170} + 30)) bash bench/gpu/live_h200.sh 2>&1 | grep -E "chat ITL|FAILED|done"
  done
  unset TANDEM_STREAM_PRIORITY
fi
step "done"
