#!/usr/bin/env bash
# c64 over HTTP as a share of our own engine without HTTP, settled: in ONE device call (after install-c.sh), the
# engine alone (bench/engine_compare.py, PASSES measured passes, median), then `tandem serve` under c64 with
# C64_REQUESTS requests (and poisson8), then the engine alone again. One pass is about a second of generation and
# spreads ±30 % on the H200, so the figure compared is each side's median/aggregate over several seconds.
#   OUT=$OUT timeout 400 bash bench/gpu/settle_h200.sh
# Writes $OUT/engine-before.json, $OUT/engine-after.json, $OUT/http.json and the server log; prints a summary.
set -uo pipefail
OUT=${OUT:-/tmp/settle-out}
PASSES=${PASSES:-7}
C64_REQUESTS=${C64_REQUESTS:-384}
SCEN=${SCENARIOS:-c64,poisson8}
mkdir -p "$OUT"
SECONDS=0
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }
step "build"
[ -d "$HOME/shape/rope" ] || timeout 90 python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out "$HOME/shape" | tail -1
engine() {
  step "engine ($1)"
  timeout "${ENGINE_S:-100}" python3 -m bench.engine_compare --tokenizer .gpu/tok --shape llama-1b --streams 64 \
    --tokens 128 --prompt-len 128 --max-iteration-tokens 512 --passes "$PASSES" --ours-only 2>&1 | tail -1 \
    | tee "$OUT/engine-$1.json"
}
engine before
step "http ($SCEN, c64=$C64_REQUESTS requests)"
timeout $((${HTTP_S:-150} + 20)) python3 -m bench.serve --only ours --model "$HOME/shape/rope" --profile quick \
  --requests "c64=$C64_REQUESTS" --timeout 60 --ready-timeout 90 --log-dir "$OUT" --scenarios "$SCEN" \
  --ours-args "--max-active 128 --no-whisper ${EXTRA_ARGS:-}" --server-budget "${HTTP_S:-150}" --out "$OUT/http.json" \
  2>&1 | grep -E "tandem (c|p|:)" | grep -v starting
engine after
python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
eng = [json.load(open(f"{out}/engine-{k}.json"))["tandem"] for k in ("before", "after")]
http = json.load(open(f"{out}/http.json"))
rows = http["servers"]["tandem"]["scenarios"]
for name, r in rows.items():
    print(name, "tok/s", r.get("tok_s"), "failed", r.get("failed"), "TTFT ms", r.get("ttft_ms"), "ITL ms", r.get("itl_ms"))
c64 = (rows.get("c64") or {}).get("tok_s")
med = sorted(p for e in eng for p in e.get("passes_tok_s", [e["aggregate_tok_s"]]))
mid = med[len(med) // 2]
print("engine passes", [e.get("passes_tok_s") for e in eng], "median", round(mid, 1))
print("c64 over HTTP", c64, "share of the engine median", round(c64 / mid, 3) if c64 else None)
EOF
step "done"
